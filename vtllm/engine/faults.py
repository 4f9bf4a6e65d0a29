"""Fault injection for reliability tests (VT_DEBUG_FAULTS): make a step raise, hang, or find
the KV cache nearly full, inside the engine rather than at the HTTP layer.

`FaultyBackend` stands between the step loop and the real backend, so an armed fault fires
where a real one would: in the collect of a step the loop has launched. Never on by default.
"""

import threading


class InjectedFault(RuntimeError):
    """What an armed "raise" fault throws out of a step (a forward or sampler failure)."""


class FaultyBackend:
    def __init__(self, backend):
        self.backend = backend
        self.raise_steps = 0  # the next N collects raise
        self.hang = threading.Event()  # set: collects block until released
        self.block_loop = threading.Event()  # set: the next launch blocks the event loop
        self.released = threading.Event()

    def launch(self, plan):
        if self.block_loop.is_set():  # a hang on the event-loop thread: no coroutine runs
            self.released.wait()
        return self.backend.launch(plan)

    def collect(self, step):
        result = self.backend.collect(step)  # the step really ran; its result is lost
        if self.hang.is_set():
            self.released.wait()  # runs in a worker thread: the event loop keeps going
        if self.raise_steps > 0:
            self.raise_steps -= 1
            raise InjectedFault(f"injected fault in step {step.step_id}")
        return result

    def release(self) -> None:
        self.hang.clear()
        self.block_loop.clear()
        self.released.set()

    def __getattr__(self, name):  # replay, close, ... go to the real backend
        return getattr(self.backend, name)


class BlockHog:
    """Holds KV blocks away from the scheduler, as if other requests held them, until
    released. Runs on the event-loop thread like every scheduler call."""

    def __init__(self, pool):
        self.pool = pool
        self.held: list[int] = []

    def leave_free(self, num_free: int) -> int:
        take = max(0, self.pool.num_free_blocks - num_free)
        self.held += self.pool.allocate(take)
        return len(self.held)

    def release(self) -> None:
        held, self.held = self.held, []
        self.pool.free(held)
