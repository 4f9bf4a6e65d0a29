"""Per-request text: incremental detokenization and stop strings.

Text that could still turn into a stop string is held back; the stop string itself is not
sent (unless include_stop_str_in_output). Partial UTF-8 characters are never emitted.
"""

from vtllm.models.tokenizer import IncrementalDetokenizer, Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], params):
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens)
        self.stops = tuple(params.stop)
        self.include_stop = params.include_stop_str_in_output
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""  # everything decoded so far (may be truncated at a stop string)
        self.num_sent = 0  # characters of `text` already handed out
        self.stopped_by: str | None = None

    def push(self, token_ids: list[int], *, final: bool) -> str:
        """Adds tokens; returns the text that is now safe to send."""
        if self.stopped_by is None and token_ids:
            start = max(0, len(self.text) - self.hold)
            self.text += self.detokenizer.push(token_ids)
            self._find_stop(start)
        end = (
            len(self.text)
            if final or self.stopped_by
            else max(self.num_sent, len(self.text) - self.hold)
        )
        delta = self.text[self.num_sent : end]
        self.num_sent = end
        return delta

    def _find_stop(self, start: int) -> None:
        best = None
        for stop in self.stops:
            i = self.text.find(stop, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            self.text = self.text[: i + len(stop) if self.include_stop else i]
            self.stopped_by = stop
