"""`python -m vtllm serve`: load, warm up, then serve HTTP until SIGINT/SIGTERM."""

import anyio

from vtllm.cli import cli_settings


def run_serve(args) -> int:
    from vtllm.server.engine import build_state, serve

    _, engine_config = cli_settings(args)
    state = build_state(engine_config)
    anyio.run(_warm_then_serve, state, serve)
    return 0


async def _warm_then_serve(state, serve) -> None:
    from vtllm.scheduler.request import Request
    from vtllm.scheduler.sampling_params import SamplingParams

    observer, state.loop.observer = state.loop.observer, None  # the warm-up is not traffic
    async with anyio.create_task_group() as tg:  # compile kernels before taking traffic
        await tg.start(state.loop.run)
        params = SamplingParams(max_tokens=2, logprobs=1, seed=0, top_p=0.9)
        collector = state.loop.add(Request("warm-up", [1, 2, 3], params))
        while not (await collector.get()).finished:
            pass
        state.loop.stop()
    state.loop.stopping = False
    state.loop.observer = observer
    await serve(state)
