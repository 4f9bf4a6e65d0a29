"""`python -m vtllm serve`: load, warm up, then serve HTTP until SIGINT/SIGTERM."""

import logging
import sys

import anyio

from vtllm import config


def run_serve(args) -> int:
    from vtllm.server.engine import build_state, serve

    cli = {k.name: getattr(args, k.name, None) for k in config.KNOBS}
    engine_config, _ = config.resolve(cli)
    logging.basicConfig(
        level=engine_config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    state = build_state(engine_config)
    anyio.run(_warm_then_serve, state, serve)
    return 0


async def _warm_then_serve(state, serve) -> None:
    from vtllm.scheduler.request import Request
    from vtllm.scheduler.sampling_params import SamplingParams

    async with anyio.create_task_group() as tg:  # compile kernels before taking traffic
        await tg.start(state.loop.run)
        params = SamplingParams(max_tokens=2, logprobs=1, seed=0, top_p=0.9)
        collector = state.loop.add(Request("warm-up", [1, 2, 3], params))
        while not (await collector.get()).finished:
            pass
        state.loop.stop()
    state.loop.stopping = False
    await serve(state)
