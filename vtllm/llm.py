"""The offline API, shaped like vLLM's: LLM(model).generate(prompts, SamplingParams)."""

import anyio

from vtllm.config import resolve
from vtllm.engine.engine import Engine, Stream
from vtllm.errors import InvalidParameter, VtllmError
from vtllm.models.chat_template import render_chat
from vtllm.models.loader import LoadedModel
from vtllm.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestOutput,
)
from vtllm.scheduler.sampling_params import SamplingParams


class LLM:
    def __init__(
        self,
        model: str | None = None,
        *,
        async_depth: int | None = None,
        enable_prefix_caching: bool | None = None,
        numerics: str | None = None,
        cli: dict | None = None,
        loaded_model: LoadedModel | None = None,
        **knobs,
    ):
        """Knobs are the settings of vtllm.config (max_num_seqs=..., kv_cache_memory=...);
        `loaded_model` reuses weights already in memory (benchmarks across settings);
        `numerics` is the cpu_numerics knob: "exact" (float32) or "fast" (int8 activations)."""
        self.config, _ = resolve(
            cli,
            model=model,
            async_depth=async_depth,
            enable_prefix_caching=enable_prefix_caching,
            cpu_numerics=numerics if numerics is not None else knobs.pop("cpu_numerics", None),
            **knobs,
        )
        self.engine = engine = Engine.build(self.config, loaded_model)
        self.loaded, self.scheduler, self.backend = engine.loaded, engine.scheduler, engine.backend
        self.max_model_len, self.tokenizer = engine.max_model_len, engine.tokenizer
        self.threads = self.backend.threads
        self.loop = engine.loop  # tests and benchmarks read its counters

    def embed(self, prompts, *, truncate_prompt_tokens: int | None = None) -> list:
        """Sentence embeddings of each prompt (a string or token ids) from the embedding model,
        `LLM(embedding_model=PATH)`: a list of EmbeddingRequestOutput (vLLM's shape)."""
        embedder = self.engine.embedder
        if embedder is None:
            raise InvalidParameter(
                "no embedding model: LLM(embedding_model=PATH) loads one", param="embedding_model"
            )
        prompts = _prompt_list(prompts)
        ids = [embedder.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        ids = embedder.check(ids, truncate_prompt_tokens)
        vectors = embedder.embed(ids)
        return [
            EmbeddingRequestOutput(
                prompt_token_ids=s, outputs=EmbeddingOutput(embedding=v.tolist())
            )
            for s, v in zip(ids, vectors, strict=True)
        ]

    def close(self) -> None:
        """Releases the backend (its worker thread; on a GPU, the graphs)."""
        self.backend.close()

    def warm_up(self) -> None:
        """Compiles (or loads from cache) every kernel on a short generation."""
        self.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        self.generate([1, 2], SamplingParams(max_tokens=2, top_p=0.9, logprobs=2, seed=0))

    # -- prompts -----------------------------------------------------------------------------
    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        tok = self.tokenizer
        return render_chat(
            tok.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.special_token(tok.bos_token_id),
            eos_token=tok.special_token(tok.eos_token_ids[0] if tok.eos_token_ids else None),
        )

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            vocab = self.loaded.config.vocab_size
            if any(t < 0 or t >= vocab for t in prompt):
                raise InvalidParameter(f"prompt token ids must be in [0, {vocab})", param="prompt")
            return None, list(prompt)
        raise InvalidParameter("a prompt is a string or a list of token ids", param="prompt")

    # -- generation --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, *, on_update=None):
        """Runs every prompt to completion; `on_update(index, Delta)` sees outputs stream in.
        `sampling_params`: one SamplingParams for every prompt, or a list of one per prompt
        (vLLM's form)."""
        prompts = _prompt_list(prompts)
        if isinstance(sampling_params, list | tuple):
            if len(sampling_params) != len(prompts):
                raise InvalidParameter(
                    f"{len(sampling_params)} sampling params for {len(prompts)} prompts: "
                    "give one per prompt, or one for all",
                    param="sampling_params",
                )
            per_prompt = list(sampling_params)
        else:
            per_prompt = [sampling_params or SamplingParams()] * len(prompts)
        for params in per_prompt:
            if not isinstance(params, SamplingParams):
                raise InvalidParameter(
                    "sampling params must be SamplingParams", param="sampling_params"
                )
            params.check_vocab(self.loaded.config.vocab_size)
        encoded = [self._prompt_ids(p) for p in prompts]
        return anyio.run(self._generate_all, encoded, per_prompt, on_update)

    def chat(self, messages: list[dict], sampling_params=None, **kw):
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        texts = [self.render_chat(m) for m in conversations]
        return self.generate(texts, sampling_params, **kw)

    async def _generate_all(self, encoded, per_prompt: list[SamplingParams], on_update):
        """Every prompt through the engine's seam, one Stream each: all queued or none."""
        error = None
        async with anyio.create_task_group() as tg:
            await tg.start(self.engine.run)
            streams: list[Stream] = []
            try:
                for (_, ids), params in zip(encoded, per_prompt, strict=True):
                    streams.append(self.engine.submit([ids], params))
            except VtllmError as exc:  # take back what was queued
                error = exc
                for stream in streams:
                    stream.abort()
                streams = []
            async with anyio.create_task_group() as readers:
                for index, stream in enumerate(streams):
                    readers.start_soon(self._read, index, stream, on_update)
            self.engine.stop()
        if error is not None:
            raise error
        return [
            _request_output(stream, text, ids)
            for stream, (text, ids) in zip(streams, encoded, strict=True)
        ]

    @staticmethod
    async def _read(index: int, stream: Stream, on_update) -> None:
        async for _choice, delta in stream:
            if on_update is not None:
                on_update(index, delta)


def _request_output(stream: Stream, text: str | None, ids: list[int]) -> RequestOutput:
    completions = [
        CompletionOutput(
            index=c.index,
            text=c.total.text,
            token_ids=c.total.token_ids,
            finish_reason=c.total.finish_reason,
            stop_reason=c.total.stop_reason,
            logprobs=c.total.logprobs or None,
        )
        for c in stream.choices
    ]
    last = stream.choices[-1].total  # prompt logprobs: each choice computed the same ones
    return RequestOutput(
        request_id=stream.id,
        prompt=text,
        prompt_token_ids=ids,
        outputs=completions,
        finished=True,
        num_cached_tokens=max(c.total.num_cached_tokens for c in stream.choices),
        # vLLM's shape: the first prompt token has no logprob
        prompt_logprobs=[None, *last.prompt_logprobs] if last.prompt_logprobs else None,
    )


def _prompt_list(prompts) -> list:
    """One prompt (a string or a list of token ids) or several, as a list of prompts."""
    single = isinstance(prompts, str) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    )
    return [prompts] if single else list(prompts)
