"""`python -m vtllm serve`: load, warm up, then serve HTTP until SIGINT/SIGTERM.

The socket is bound only after a real forward has worked (fault F17): while the model loads
and warms up, clients get "connection refused", never a 200 from /health or an API route
that cannot answer yet. A supervisor's readiness probe sees the same.
"""

import gc
import logging
import os
import signal
import sys

import anyio

from vtllm.cli import cli_settings

log = logging.getLogger("vtllm.server")


def run_serve(args) -> int:
    _, engine_config = cli_settings(args)
    if engine_config.data_parallel_size > 1:  # replica servers behind a router
        from vtllm.cli.data_parallel import run_data_parallel

        return run_data_parallel(engine_config)
    return serve_config(engine_config, getattr(args, "started", None))


def serve_config(engine_config, started=None) -> int:
    signal.signal(signal.SIGTERM, _end_the_start)
    from vtllm.cli.warmup import StartupClock
    from vtllm.server.engine import build_state, serve

    clock = StartupClock(engine_config, started)
    clock.listen()
    try:
        state = build_state(engine_config, phases=clock.phases)
    except BaseException:
        clock.stop_listening()
        raise
    anyio.run(_warm_then_serve, state, serve, clock)
    return 0


def _end_the_start(signum, _frame) -> None:
    """SIGTERM before serving (load, compile, warm-up) ends the process at once: nothing is in
    flight, and numba writes its cache files whole (a temporary file, then a rename). Once
    serving, the server's own handler drains instead. Spelled out because in a container
    vtllm is PID 1, which the kernel spares from signals it has no handler for: a stop during
    a start would wait out its timeout and end in SIGKILL. An exit rather than an exception,
    which could land in a __del__ and be ignored."""
    log.warning("%s during the start: exiting", signal.Signals(signum).name)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


async def warm_up(state, clock) -> None:
    """One real forward through the step loop, compiling what the kernel table left to the
    first call; the step loop's observer (metrics) does not see it."""
    from vtllm.scheduler.sampling_params import SamplingParams

    engine = state.engine
    observer, engine.observer = engine.observer, None  # the warm-up is not traffic
    clock.warmup_starts()
    async with anyio.create_task_group() as tg:  # compile kernels before taking traffic
        await tg.start(engine.run)
        delay = state.config.debug_warmup_delay_s
        if delay > 0:  # a slow load or compile, for tests of the start-up ordering
            log.warning("holding the warm-up for %.1fs (VT_DEBUG_WARMUP_DELAY_S)", delay)
            await anyio.sleep(delay)
        params = SamplingParams(max_tokens=2, logprobs=1, seed=0, top_p=0.9)
        async for _ in engine.submit([[1, 2, 3]], params, prefix="warm-up"):
            pass
        engine.stop()
    engine.observer = observer
    clock.warmup_done()


async def _warm_then_serve(state, serve, clock) -> None:
    try:
        await warm_up(state, clock)
    finally:
        clock.stop_listening()
    if state.config.device == "cpu":
        from vtllm.executor.host_memory import release_start_pages

        release_start_pages("warm-up done")  # what the warm-up's first calls linked
    # Everything made so far (the model, tokenizer, kernels, graphs) lives as long as the
    # server: out of the collector's sight, a full collection stops walking ~130k objects.
    # Each such pass would hold the event loop, and with it every stream and the step loop.
    gc.collect()
    gc.freeze()
    log.info("%s", clock.summary())
    await serve(state)
