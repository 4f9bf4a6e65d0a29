"""The CPU backend's device clock: a running step counts up to the moment it is read."""

import threading
import time

from vtllm.executor.backend import CpuBackend


class _BlockingRunner:
    """A runner whose step runs until the test lets it finish."""

    def __init__(self):
        self.started, self.release = threading.Event(), threading.Event()

    def execute(self, plan):
        self.started.set()
        self.release.wait(timeout=30)
        return plan


class _Plan:
    step_id = 0


def test_device_seconds_count_a_running_step_up_to_the_read():
    runner = _BlockingRunner()
    backend = CpuBackend(runner, threads=1)
    try:
        assert backend.device_seconds == 0.0
        step = backend.launch(_Plan())
        assert runner.started.wait(timeout=30)
        time.sleep(0.05)
        window_start = time.perf_counter()
        first = backend.device_seconds
        time.sleep(0.05)
        second = backend.device_seconds
        window = time.perf_counter() - window_start
        # the step began before the window; only the window's part shows in the difference
        assert first >= 0.05
        assert 0.05 <= second - first <= window
        runner.release.set()
        backend.collect(step)
        done = backend.device_seconds
        time.sleep(0.02)
        assert backend.device_seconds == done >= second  # a finished step stops the clock
    finally:
        runner.release.set()
        backend.close()
