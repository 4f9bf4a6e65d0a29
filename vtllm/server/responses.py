"""Shaping engine updates into OpenAI completion and chat responses, streamed or whole."""

from vtllm.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)


class _Shaper:
    def __init__(self, state, req, sub):
        self.state, self.req, self.sub = state, req, sub
        self.text = [""] * len(sub.choices)
        options = req.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        # the name the client asked for (one of the served names), as vLLM answers
        self.model = req.model if req.model in state.model_names else state.model_name

    def _token(self, token_id: int) -> str:
        return self.state.tokenizer.decode([token_id], skip_special_tokens=False)

    def usage(self) -> Usage:
        # n choices share one prompt: count it once
        prompt = sum(len(c.prompt_ids) for c in self.sub.choices if c.first_of_prompt)
        completion = sum(len(c.total.token_ids) for c in self.sub.choices)
        cached = sum(c.total.num_cached_tokens for c in self.sub.choices if c.first_of_prompt)
        details = PromptTokensDetails(cached)
        return Usage(prompt, completion, prompt + completion, details)

    def _running_usage(self, choice) -> Usage | None:
        """continuous_usage_stats: one choice's usage so far, on each of its chunks (vLLM's
        shape: per choice, no details)."""
        if not self.continuous_usage:
            return None
        prompt, done = len(choice.prompt_ids), len(choice.total.token_ids)
        return Usage(prompt, done, prompt + done)

    def _prompt_logprobs(self, choice) -> PromptLogprobs:
        """vLLM's shape: None for the first prompt token (nothing predicts it), then the
        token's own logprob and its top alternatives, keyed by token id."""
        out: PromptLogprobs = [None]
        for lp in choice.total.prompt_logprobs:
            entry = {str(lp.token_id): PromptLogprob(lp.logprob, lp.rank, self._token(lp.token_id))}
            for rank, (t, v) in enumerate(zip(lp.top_ids, lp.top_logprobs, strict=True), 1):
                entry.setdefault(str(t), PromptLogprob(v, rank, self._token(t)))
            out.append(entry)
        return out


class CompletionShaper(_Shaper):
    def __init__(self, state, req, sub):
        super().__init__(state, req, sub)
        self.text_offset = [0] * len(sub.choices)  # per choice, across streamed chunks

    def opening(self):
        if not self.req.echo:
            return []
        choices = [CompletionChoice(c.index, self._echo(c)) for c in self.sub.choices]
        return [self._response(choices, self._running_usage(self.sub.choices[0]))]

    def _echo(self, choice) -> str:
        return self.state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False)

    def _logprobs(self, update, index: int | None = None) -> CompletionLogprobs | None:
        """`index` given (streaming): offsets continue from that choice's earlier chunks."""
        if self.req.logprobs is None:
            return None
        lps = update.logprobs
        tokens = [self._token(lp.token_id) for lp in lps]
        tops = [
            {self._token(t): v for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)}
            for lp in lps
        ]
        offsets, pos = [], 0 if index is None else self.text_offset[index]
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        if index is not None:
            self.text_offset[index] = pos
        return CompletionLogprobs(tokens, [lp.logprob for lp in lps], tops, offsets)

    def _response(self, choices, usage=None) -> CompletionResponse:
        sub = self.sub
        return CompletionResponse(sub.id, sub.created, self.model, choices, usage=usage)

    def chunk(self, choice, update):
        if not update.text and not update.finished and not update.logprobs:
            return None
        return self._response(
            [
                CompletionChoice(
                    choice.index,
                    update.text,
                    update.finish_reason if update.finished else None,
                    update.stop_reason if update.finished else None,
                    self._logprobs(update, choice.index),
                )
            ],
            self._running_usage(choice),
        )

    def usage_chunk(self):
        return self._response([], self.usage()) if self.include_usage else None

    def final(self) -> CompletionResponse:
        choices = []
        for c in self.sub.choices:
            text = (self._echo(c) if self.req.echo else "") + c.total.text
            choice = CompletionChoice(
                c.index, text, c.total.finish_reason, c.total.stop_reason, self._logprobs(c.total)
            )
            if self.req.prompt_logprobs is not None:
                choice.prompt_logprobs = self._prompt_logprobs(c)
            choices.append(choice)
        return self._response(choices, self.usage())


class ChatShaper(_Shaper):
    def _logprobs(self, update) -> ChatLogprobs | None:
        if not self.req.logprobs:
            return None
        content = []
        for lp in update.logprobs:
            token = self._token(lp.token_id)
            tops = [
                TopLogprob(self._token(t), v, list(self._token(t).encode()))
                for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)
            ]
            content.append(ChatTokenLogprob(token, lp.logprob, list(token.encode()), tops))
        return ChatLogprobs(content)

    def _chunk(self, choices, usage=None) -> ChatCompletionChunk:
        sub = self.sub
        return ChatCompletionChunk(sub.id, sub.created, self.model, choices, usage=usage)

    def opening(self):
        return [
            self._chunk(
                [
                    ChatChunkChoice(c.index, ChatMessageOut(role="assistant", content=""))
                    for c in self.sub.choices
                ],
                self._running_usage(self.sub.choices[0]),
            )
        ]

    def chunk(self, choice, update):
        if not update.text and not update.finished and not update.logprobs:
            return None
        return self._chunk(
            [
                ChatChunkChoice(
                    choice.index,
                    ChatMessageOut(content=update.text),
                    update.finish_reason if update.finished else None,
                    update.stop_reason if update.finished else None,
                    self._logprobs(update),
                )
            ],
            self._running_usage(choice),
        )

    def usage_chunk(self):
        return self._chunk([], self.usage()) if self.include_usage else None

    def final(self) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                c.index,
                ChatMessageOut(role="assistant", content=c.total.text),
                c.total.finish_reason,
                c.total.stop_reason,
                self._logprobs(c.total),
            )
            for c in self.sub.choices
        ]
        sub = self.sub
        response = ChatCompletionResponse(
            sub.id, sub.created, self.model, choices, usage=self.usage()
        )
        if self.req.prompt_logprobs is not None:  # one prompt for every choice: vLLM's place
            response.prompt_logprobs = self._prompt_logprobs(sub.choices[0])
        return response
