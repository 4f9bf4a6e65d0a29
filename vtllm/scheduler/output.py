"""The one output type: what a request produced since its previous delta.

The scheduler makes a Delta per request per update; the engine adds the text it detokenized
(and ends a request on a stop string); a reader that lags gets the deltas it missed merged
into one; the HTTP shaper and the offline API read it as it is. One type all the way, so
following a request's output takes few hops.
"""

import msgspec

from vtllm.scheduler.plan import TokenLogprobs

STOP = "stop"  # a stop token id or eos was sampled (or the caller saw a stop string)
LENGTH = "length"  # max_tokens or max_model_len reached
ABORT = "abort"  # the client went away or the server gave up on it
ERROR = "error"  # the engine failed while serving it


class Delta(msgspec.Struct, kw_only=True):
    """New output of one request since its previous Delta; at most one per request per update.

    When a request finishes with finish_reason "stop", token_ids[-1] is the stop or eos token:
    it counts as an output token (vLLM-style usage) but is not rendered as text. stop_reason
    is that id for stop_token_ids, None for eos, or the caller's string for stop strings
    (finish_request). The counters are totals so far, not increments.
    """

    request_id: str
    token_ids: list[int] = []
    text: str = ""  # filled by the engine's detokenizer; the scheduler knows no text
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] = []  # one per new token, when the request asked
    prompt_logprobs: list[TokenLogprobs] = []  # entries for the prompt chunk just computed
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_output_tokens: int = 0  # all output tokens known so far, new ones included

    def merge(self, later: "Delta") -> None:
        """Folds the request's next delta into this one: lists and text grow, the rest is the
        later delta's (a count of 0 means it was not known then)."""
        self.text += later.text
        self.token_ids += later.token_ids
        if later.logprobs:
            self.logprobs += later.logprobs
        if later.prompt_logprobs:
            self.prompt_logprobs = self.prompt_logprobs + later.prompt_logprobs  # not shared
        self.finished = later.finished
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.num_prompt_tokens = later.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = later.num_cached_tokens or self.num_cached_tokens
        self.num_output_tokens = later.num_output_tokens
