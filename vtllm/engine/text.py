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
        # Decoded text not yet handed out: at most `hold` characters between pushes, so a
        # push costs the same at the 4,000th token as at the first. A stop string cannot start
        # in text already handed out: it would have been whole, and found, when that text was.
        self.pending = ""
        self.stopped_by: str | None = None

    def push(self, token_ids: list[int], *, final: bool) -> str:
        """Adds tokens; returns the text that is now safe to send."""
        if self.stopped_by is None and (token_ids or final):
            self.pending += self.detokenizer.push(token_ids)
            if final:
                self.pending += self.detokenizer.flush()
            self._find_stop()
        if final or self.stopped_by:
            cut = len(self.pending)
        else:
            cut = max(0, len(self.pending) - self.hold)
        delta, self.pending = self.pending[:cut], self.pending[cut:]
        return delta

    def _find_stop(self) -> None:
        best = None
        for stop in self.stops:
            i = self.pending.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            self.pending = self.pending[: i + len(stop) if self.include_stop else i]
            self.stopped_by = stop
