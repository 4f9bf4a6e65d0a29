"""What the offline API returns, shaped like vLLM's RequestOutput."""

import msgspec

from vtllm.scheduler.plan import TokenLogprobs


class CompletionOutput(msgspec.Struct, kw_only=True):
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # stop | length | abort | error
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprobs] | None = None


class EmbeddingOutput(msgspec.Struct, kw_only=True):
    embedding: list[float]


class EmbeddingRequestOutput(msgspec.Struct, kw_only=True):
    """One input's embedding from LLM.embed, shaped like vLLM's."""

    prompt_token_ids: list[int]
    outputs: EmbeddingOutput


class RequestOutput(msgspec.Struct, kw_only=True):
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None
