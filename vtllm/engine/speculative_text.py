"""Text of a delta that carries several tokens at once (a speculative step's run), pushed the
way one-token deltas would be: token by token, so a stop string ends the request at the token
that completed it, and the tokens after it, which a request without speculation never
sampled, leave the delta (and its usage counts)."""

from vtllm.engine.text import TextStream
from vtllm.scheduler.output import Delta


def push_run(text: TextStream, delta: Delta, visible: list[int]) -> str:
    """The text of `visible` (delta's tokens without a trailing stop token); on a stop string
    the delta keeps only the tokens up to the one that completed it, and is marked unfinished
    so the step loop ends the request with the stop string as a one-token delta would."""
    parts = []
    last = len(visible) - 1
    for i, token in enumerate(visible):
        parts.append(text.push([token], final=delta.finished and i == last))
        if text.stopped_by is not None:
            drop = len(delta.token_ids) - (i + 1)
            if drop:
                del delta.token_ids[i + 1 :]
                if delta.logprobs:
                    del delta.logprobs[i + 1 :]
                delta.num_output_tokens -= drop
                delta.finished, delta.finish_reason, delta.stop_reason = False, None, None
            break
    if not visible:
        parts.append(text.push([], final=delta.finished))
    return "".join(parts)
