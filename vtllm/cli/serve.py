"""`python -m vtllm serve`: load, warm up, then serve HTTP until SIGINT/SIGTERM.

The socket is bound only after a real forward has worked (fault F17): while the model loads
and warms up, clients get "connection refused", never a 200 from /health or an API route
that cannot answer yet. A supervisor's readiness probe sees the same.
"""

import gc
import logging
import time

import anyio

from vtllm.cli import cli_settings

log = logging.getLogger("vtllm.server")


def run_serve(args) -> int:
    from vtllm.server.engine import build_state, serve

    _, engine_config = cli_settings(args)
    state = build_state(engine_config)
    anyio.run(_warm_then_serve, state, serve)
    return 0


async def _warm_then_serve(state, serve) -> None:
    from vtllm.scheduler.sampling_params import SamplingParams

    observer, state.loop.observer = state.loop.observer, None  # the warm-up is not traffic
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:  # compile kernels before taking traffic
        await tg.start(state.loop.run)
        delay = state.config.debug_warmup_delay_s
        if delay > 0:  # a slow load or compile, for tests of the start-up ordering
            log.warning("holding the warm-up for %.1fs (VT_DEBUG_WARMUP_DELAY_S)", delay)
            await anyio.sleep(delay)
        params = SamplingParams(max_tokens=2, logprobs=1, seed=0, top_p=0.9)
        collector = state.loop.add("warm-up", [1, 2, 3], params)
        while not (await collector.get()).finished:
            pass
        state.loop.stop()
    state.loop.stopping = False
    state.loop.observer = observer
    log.info("warm-up forward done in %.2fs", time.perf_counter() - started)
    # Everything made so far (the model, tokenizer, kernels, graphs) lives as long as the
    # server: out of the collector's sight, a full collection stops walking ~130k objects.
    # Each such pass would hold the event loop, and with it every stream and the step loop.
    gc.collect()
    gc.freeze()
    await serve(state)
