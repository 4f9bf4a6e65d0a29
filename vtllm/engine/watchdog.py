"""The engine watchdog (VT_ENGINE_ITERATION_TIMEOUT_S): no step finishing in time means dead.

A thread, not a task: a step can hang on the event-loop thread itself (a launch, a kernel that
holds the GIL), and then no coroutine would ever run to notice. When the step loop has had
work but no step completed for `timeout` seconds, the watchdog asks the event loop to declare
the engine dead (which fails in-flight requests and turns /health to 503); if the event loop
does not manage that and exit within `grace` seconds, the thread ends the process itself.
A backend with a `failure` property (executor/tp_backend: a worker process ended) is read on
the same beat, so a dead worker kills the engine within one period, idle or not.
Either way the process exits non-zero, so a supervisor restarts it.
"""

import logging
import os
import sys
import threading
from time import perf_counter

log = logging.getLogger("vtllm.engine")
EXIT_ENGINE_DEAD = 3


class Watchdog:
    def __init__(self, loop, timeout: float, on_timeout, *, call_soon_threadsafe, grace=10.0):
        self.loop = loop  # the StepLoop: reads .stepping and .progress_at
        self.timeout = timeout
        self.on_timeout = on_timeout  # runs on the event loop
        self.call_soon_threadsafe = call_soon_threadsafe
        self.grace = grace
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vtllm-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = min(max(self.timeout / 10, 0.05), 1.0)
        while not self._stop.wait(period):
            loop = self.loop
            if loop.dead is not None:
                continue
            # a backend of worker processes (tensor parallelism) says when one has ended,
            # also while the engine is idle and no step would ever stall
            reason = getattr(getattr(loop, "backend", None), "failure", None)
            if reason is not None:
                break
            stalled = perf_counter() - loop.progress_at
            if loop.stepping and stalled > self.timeout:
                reason = f"no engine step finished within {self.timeout:g}s"
                break
        else:
            return
        self.fired = True
        log.error("watchdog: %s; failing in-flight requests", reason)
        try:
            self.call_soon_threadsafe(self.on_timeout, reason)
        except RuntimeError:  # the event loop is closed
            pass
        if not self._stop.wait(self.grace):
            log.critical("watchdog: the event loop did not shut down in %gs; exiting", self.grace)
            sys.stderr.flush()
            os._exit(EXIT_ENGINE_DEAD)
