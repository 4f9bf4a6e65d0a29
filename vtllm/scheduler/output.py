"""What the scheduler tells the rest of the server about a request after each step."""

import msgspec

from vtllm.scheduler.plan import TokenLogprobs

STOP = "stop"  # a stop token id or eos was sampled (or the caller saw a stop string)
LENGTH = "length"  # max_tokens or max_model_len reached
ABORT = "abort"  # the client went away or the server gave up on it
ERROR = "error"  # the engine failed while serving it


class Delta(msgspec.Struct):
    """New output of one request since its previous Delta; at most one per request per update.

    When update() finishes a request with finish_reason "stop", new_token_ids[-1] is the stop
    or eos token: it counts as an output token (vLLM-style usage) but is not rendered as text.
    stop_reason is that id for stop_token_ids, None for eos, or the caller's string for stop
    strings (finish_request).
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per new token, when the request asked
    prompt_logprobs: list[TokenLogprobs] | None = None  # entries for the chunk just computed
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_output_tokens: int = 0  # all output tokens known so far, new ones included
