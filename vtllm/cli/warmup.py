"""`vtllm warmup`, and what every start says about compiling the kernels.

The CPU kernels are numba functions cached on disk (`cache=True`). Most have explicit
signatures, so numba compiles them when the kernel table is imported; a few compile on their
first call, inside the warm-up forward. On an empty cache that is tens of seconds of a silent
start, so KernelCompileLog listens to numba's compile events and logs one line per family of
kernels (the module that defines them). A cache hit raises no event: a warm start logs nothing.

`vtllm warmup` runs what serve runs before it takes traffic (load, kernel table, one
forward) and exits, so that an image or a deployment can fill the cache ahead of time.
"""

import logging
import threading
import time

from numba.core import event

from vtllm.cli import cli_settings

log = logging.getLogger("vtllm.kernels")


class KernelCompileLog(event.Listener):
    """Logs compilation of vtllm's numba kernels as it happens; `seconds` is the wall time of
    the outermost compiles (a kernel's helpers compile inside it and count as part of it)."""

    def __init__(self):
        self.seconds = 0.0
        self.kernels = 0
        self._depth = threading.local()
        self._family: str | None = None  # the family being compiled, and its tally so far
        self._family_kernels = 0
        self._family_seconds = 0.0
        self._started = 0.0

    def __enter__(self):
        event.register("numba:compile", self)
        return self

    def __exit__(self, *exc) -> None:
        event.unregister("numba:compile", self)
        self.end_family()
        if self.kernels:
            log.info(
                "compiled %d kernel%s in %.1fs, cached for later starts",
                self.kernels,
                "s" * (self.kernels > 1),
                self.seconds,
            )

    def on_start(self, ev) -> None:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth:
            return
        self._started = time.perf_counter()
        module = getattr(ev.data["dispatcher"].py_func, "__module__", "") or ""
        family = module.rsplit(".", 1)[-1]
        if family != self._family:
            self.end_family()
            if not self.kernels and self._family is None:
                log.info(
                    "compiling the CPU kernels: this happens once, later starts load them from "
                    "numba's cache (%s)",
                    _cache_dir(),
                )
            self._family = family

    def on_end(self, ev) -> None:
        self._depth.n -= 1
        if self._depth.n:
            return
        took = time.perf_counter() - self._started
        self.seconds += took
        self.kernels += 1
        self._family_kernels += 1
        self._family_seconds += took

    def end_family(self) -> None:
        if self._family_kernels:
            log.info(
                "compiled %s: %d kernel%s in %.1fs",
                self._family,
                self._family_kernels,
                "s" * (self._family_kernels > 1),
                self._family_seconds,
            )
        self._family_kernels, self._family_seconds = 0, 0.0


def _cache_dir() -> str:
    import numba

    return numba.config.CACHE_DIR or "__pycache__ beside vtllm/kernels/cpu"


class StartupClock:
    """Where a start's time goes, for the one line that says it is ready: load, compile,
    KV allocation (engine.build fills these in `phases`), warm-up, and the rest (imports,
    tokenizer, set-up) as other. Kernels compiled during the warm-up forward count as compile."""

    def __init__(self, engine_config, started: float | None = None):
        self.started = time.perf_counter() if started is None else started
        self.phases: dict[str, float] = {}
        # On the GPU, compilation and its caching are the CUDA runner's business.
        self.compile_log = KernelCompileLog() if engine_config.device == "cpu" else None
        self._warmup_started = 0.0
        self._compiled_before_warmup = 0.0
        self._listening = False

    def listen(self) -> None:
        """From before the kernel table is imported until the warm-up forward is done."""
        if self.compile_log is not None and not self._listening:
            self.compile_log.__enter__()
            self._listening = True

    def stop_listening(self) -> None:
        if self._listening:
            self._listening = False
            self.compile_log.__exit__(None, None, None)

    def warmup_starts(self) -> None:
        self._warmup_started = time.perf_counter()
        if self.compile_log is not None:
            self.compile_log.end_family()  # the kernel table's last: said now, not at the end
            self._compiled_before_warmup = self.compile_log.seconds

    def warmup_done(self) -> None:
        warmup = time.perf_counter() - self._warmup_started
        if self.compile_log is not None:
            lazy = self.compile_log.seconds - self._compiled_before_warmup
            self.phases["compile"] = self.phases.get("compile", 0.0) + lazy
            warmup -= lazy
        self.phases["warm-up"] = warmup

    def summary(self, what: str = "ready") -> str:
        """'ready in 2.1s: load 0.3s, compile 0.4s (from cache), ...' as of now."""
        total = time.perf_counter() - self.started
        parts = []
        for name, seconds in self.phases.items():
            note = ""
            if name == "compile" and self.compile_log is not None:
                note = " (from cache)" if not self.compile_log.kernels else " (once)"
            parts.append(f"{name} {seconds:.1f}s{note}")
        parts.append(f"other {max(0.0, total - sum(self.phases.values())):.1f}s")
        return f"{what} in {total:.1f}s: " + ", ".join(parts)


def run_warmup(args) -> int:
    import anyio

    from vtllm.cli.serve import warm_up
    from vtllm.server.engine import build_state

    _, engine_config = cli_settings(args)
    clock = StartupClock(engine_config, getattr(args, "started", None))
    clock.listen()
    try:
        state = build_state(engine_config, phases=clock.phases)
        anyio.run(warm_up, state, clock)
    finally:
        clock.stop_listening()
    state.engine.backend.close()
    log.info("%s", clock.summary("warmup done"))
    return 0
