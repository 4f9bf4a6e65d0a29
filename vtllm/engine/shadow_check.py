"""VT_SHADOW_CHECK_RATE: replay a share of steps the synchronous way and compare tokens.

Right before step N+1 is launched, one sampled chunk of step N is queued for a replay on the
worker, so it runs on exactly the state step N left. The replay feeds the ids the host knows
(never the device mirror) and runs the chunk alone; when update() later reveals step N's token,
the two must be equal. A mismatch means depth 2 and depth 1 would have diverged.
"""

import logging
import random

log = logging.getLogger("vtllm.engine")


class ShadowCheck:
    def __init__(self, backend, rate: float):
        self.backend = backend
        self.rate = rate
        self.num_checks = 0
        self.num_mismatches = 0
        self._last: list = []  # (chunk, request) of the last launched plan's sampled chunks
        self._pending = None  # (future, request, position)

    def before_launch(self) -> None:
        if self._pending is not None or not self._last or random.random() >= self.rate:
            return
        chunk, request = random.choice(self._last)
        end = chunk.start + chunk.num_tokens
        if request.is_finished or request.num_known_tokens < end:
            return  # inputs still in flight, or gone
        history = request.all_token_ids()[:end]
        self._pending = (self.backend.replay(chunk.slot, chunk.start, history), request, end)

    def launched(self, plan, tracked) -> None:
        if not self.rate:
            return
        by_slot = {t.request.slot: t.request for t in tracked.values()}
        # constrained requests' tokens follow their masks, which a replay does not apply;
        # a speculative chunk's tokens are known only once it is verified
        self._last = [
            (c, by_slot[c.slot])
            for c in plan.chunks
            if c.sample
            and not c.draft_token_ids
            and c.slot in by_slot
            and by_slot[c.slot].constraint is None
        ]

    def after_update(self) -> None:
        if self._pending is None or not self._pending[0].done():
            return
        future, request, position = self._pending
        if request.num_known_tokens <= position:
            if request.is_finished:
                self._pending = None  # aborted before its token arrived
            return
        self._pending = None
        expected, token = request.all_token_ids()[position], future.result()
        self.num_checks += 1
        if token != expected:
            self.num_mismatches += 1
            log.error(
                "shadow check: request %s position %d replayed %d, the step gave %d",
                request.request_id,
                position,
                token,
                expected,
            )
