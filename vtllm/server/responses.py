"""Shaping the engine's deltas into OpenAI completion and chat responses, streamed or whole.

A stream's chunk is made from one Delta (its choice's new output); a whole response from each
choice's total, the same type with every delta merged (vtllm/engine/engine.py's Stream).
"""

from vtllm.server.chat_output import finish_reason, streamed_message, whole_message
from vtllm.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDeltaOut,
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
    def __init__(self, state, req, stream):
        self.state, self.req, self.stream = state, req, stream
        options = req.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        # the name the client asked for (one of the served names), as vLLM answers
        self.model = req.model if req.model in state.model_names else state.model_name

    def _token(self, token_id: int) -> str:
        return self.state.tokenizer.decode([token_id], skip_special_tokens=False)

    def usage(self) -> Usage:
        # n choices share one prompt: count it once
        prompt = sum(len(c.prompt_ids) for c in self.stream.choices if c.first_of_prompt)
        completion = sum(len(c.total.token_ids) for c in self.stream.choices)
        cached = sum(c.total.num_cached_tokens for c in self.stream.choices if c.first_of_prompt)
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
        k = self.req.prompt_logprobs  # echo may have asked the engine for more
        for lp in choice.total.prompt_logprobs:
            entry = {str(lp.token_id): PromptLogprob(lp.logprob, lp.rank, self._token(lp.token_id))}
            pairs = zip(lp.top_ids[:k], lp.top_logprobs[:k], strict=True)
            for rank, (t, v) in enumerate(pairs, 1):
                entry.setdefault(str(t), PromptLogprob(v, rank, self._token(t)))
            out.append(entry)
        return out


class CompletionShaper(_Shaper):
    """echo puts the prompt's text first (streamed: in an opening chunk). With logprobs, as in
    vLLM, the prompt's tokens lead the logprobs too (the first one's None: nothing predicts
    it); streamed, that chunk waits for the choice's first token, which follows its prompt
    logprobs. echo with max_tokens 0 scores a prompt: the one token generated to run it is
    not shown."""

    def __init__(self, state, req, stream):
        super().__init__(state, req, stream)
        self.text_offset = [0] * len(stream.choices)  # per choice, across streamed chunks
        self.echo_logprobs = req.echo and req.logprobs is not None
        self.echo_only = req.echo and req.max_tokens == 0
        self.echoed = [not self.echo_logprobs] * len(stream.choices)  # streamed with logprobs

    def opening(self):
        if not self.req.echo or self.echo_logprobs:
            return []
        choices = [CompletionChoice(c.index, self._echo(c)) for c in self.stream.choices]
        return [self._response(choices, self._running_usage(self.stream.choices[0]))]

    def _echo(self, choice) -> str:
        return self.state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False)

    def _logprobs(self, delta, index=None, echo=None) -> CompletionLogprobs | None:
        """`index` given (streaming): offsets continue from that choice's earlier chunks;
        `echo` (a choice): its prompt's tokens come first."""
        if self.req.logprobs is None:
            return None
        k = self.req.logprobs  # the prompt's entries may hold more (prompt_logprobs)
        entries = [] if self.echo_only else delta.logprobs
        tokens, values, tops = [], [], []
        if echo is not None:
            tokens.append(self._token(echo.prompt_ids[0]))
            values.append(None)
            tops.append(None)
            entries = [*echo.total.prompt_logprobs, *entries]
        for lp in entries:
            tokens.append(self._token(lp.token_id))
            values.append(lp.logprob)
            pairs = zip(lp.top_ids[:k], lp.top_logprobs[:k], strict=True)
            tops.append({self._token(t): v for t, v in pairs})
        offsets, pos = [], 0 if index is None else self.text_offset[index]
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        if index is not None:
            self.text_offset[index] = pos
        return CompletionLogprobs(tokens, values, tops, offsets)

    def _response(self, choices, usage=None) -> CompletionResponse:
        stream = self.stream
        return CompletionResponse(stream.id, stream.created, self.model, choices, usage=usage)

    def chunk(self, choice, delta):
        text = "" if self.echo_only else delta.text
        echo = None
        if not self.echoed[choice.index]:
            if not delta.token_ids and not delta.finished:
                return None  # prompt logprobs still coming
            self.echoed[choice.index], echo = True, choice
            text = self._echo(choice) + text
        elif not text and not delta.finished and (self.echo_only or not delta.logprobs):
            return None
        return self._response(
            [
                CompletionChoice(
                    choice.index,
                    text,
                    delta.finish_reason if delta.finished else None,
                    delta.stop_reason if delta.finished else None,
                    self._logprobs(delta, choice.index, echo),
                )
            ],
            self._running_usage(choice),
        )

    def usage_chunk(self):
        return self._response([], self.usage()) if self.include_usage else None

    def final(self) -> CompletionResponse:
        choices = []
        for c in self.stream.choices:
            shown = "" if self.echo_only else c.total.text
            text = (self._echo(c) if self.req.echo else "") + shown
            logprobs = self._logprobs(c.total, echo=c if self.echo_logprobs else None)
            choice = CompletionChoice(
                c.index, text, c.total.finish_reason, c.total.stop_reason, logprobs
            )
            if self.req.prompt_logprobs is not None:
                choice.prompt_logprobs = self._prompt_logprobs(c)
            choices.append(choice)
        return self._response(choices, self.usage())


class ChatShaper(_Shaper):
    def __init__(self, state, req, stream, setup=None):
        super().__init__(state, req, stream)
        # each choice's reader of reasoning and tool calls (chat_output.py); None: plain text
        readers = [None if setup is None else setup.output() for _ in stream.choices]
        self.readers = [None if r is None or r.plain else r for r in readers]

    def _logprobs(self, delta) -> ChatLogprobs | None:
        if not self.req.logprobs:
            return None
        content = []
        for lp in delta.logprobs:
            token = self._token(lp.token_id)
            tops = [
                TopLogprob(self._token(t), v, list(self._token(t).encode()))
                for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)
            ]
            content.append(ChatTokenLogprob(token, lp.logprob, list(token.encode()), tops))
        return ChatLogprobs(content)

    def _chunk(self, choices, usage=None) -> ChatCompletionChunk:
        stream = self.stream
        return ChatCompletionChunk(stream.id, stream.created, self.model, choices, usage=usage)

    def opening(self):
        return [
            self._chunk(
                [
                    ChatChunkChoice(c.index, ChatDeltaOut(role="assistant", content=""))
                    for c in self.stream.choices
                ],
                self._running_usage(self.stream.choices[0]),
            )
        ]

    def chunk(self, choice, delta):
        if not delta.text and not delta.finished and not delta.logprobs:
            return None
        reader, reason = self.readers[choice.index], delta.finish_reason
        if reader is None:
            message = ChatDeltaOut(content=delta.text)
        else:
            message = streamed_message(reader.feed(delta.text, delta.finished))
            reason = finish_reason(reason, reader.called)
            if message is None and not delta.finished and not delta.logprobs:
                return None  # held back: it may still be a marker
        return self._chunk(
            [
                ChatChunkChoice(
                    choice.index,
                    message or ChatDeltaOut(),
                    reason if delta.finished else None,
                    delta.stop_reason if delta.finished else None,
                    self._logprobs(delta),
                )
            ],
            self._running_usage(choice),
        )

    def usage_chunk(self):
        return self._chunk([], self.usage()) if self.include_usage else None

    def final(self) -> ChatCompletionResponse:
        choices = []
        for c, reader in zip(self.stream.choices, self.readers, strict=True):
            message = ChatMessageOut(role="assistant", content=c.total.text)
            reason = c.total.finish_reason
            if reader is not None:
                message = whole_message(reader.whole(c.total.text))
                reason = finish_reason(reason, bool(message.tool_calls))
            choices.append(
                ChatChoice(c.index, message, reason, c.total.stop_reason, self._logprobs(c.total))
            )
        stream = self.stream
        response = ChatCompletionResponse(
            stream.id, stream.created, self.model, choices, usage=self.usage()
        )
        if self.req.prompt_logprobs is not None:  # one prompt for every choice: vLLM's place
            response.prompt_logprobs = self._prompt_logprobs(stream.choices[0])
        return response
