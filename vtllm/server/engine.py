"""The server's task tree: one anyio task group holding the step loop and hypercorn.

SIGINT/SIGTERM turn /health to 503 and stop hypercorn, which lets in-flight responses finish
within its graceful timeout; then the step loop drains and exits.
"""

import logging
import os
import signal

import anyio
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from vtllm.config import EngineConfig
from vtllm.engine.build import build_parts
from vtllm.engine.loop import StepLoop
from vtllm.server.app import ServerState, build_app
from vtllm.server.metrics import MetricsObserver

log = logging.getLogger("vtllm.server")


def build_state(config: EngineConfig) -> ServerState:
    loaded, scheduler, backend, max_model_len = build_parts(config)
    model_name = config.served_model_name or loaded.name
    loop = StepLoop(
        scheduler,
        backend,
        loaded.tokenizer,
        async_depth=config.async_depth,
        shadow_rate=config.shadow_check_rate,
        observer=MetricsObserver(model_name),
    )
    return ServerState(
        loop=loop,
        tokenizer=loaded.tokenizer,
        model_name=model_name,
        vocab_size=loaded.config.vocab_size,
        max_model_len=max_model_len,
        config=config,
    )


async def serve(state: ServerState, *, ready=None) -> None:
    """Runs until SIGINT/SIGTERM. `ready(port)` is called once the socket listens."""
    config = state.config
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    hconfig.h11_max_incomplete_size = 64 * 1024  # request line + headers; beyond: 431
    hconfig.read_timeout = 30  # a body trickled slower than this is cut off
    hconfig.graceful_timeout = 5.0  # after our own drain (drain_then_stop)
    stop = anyio.Event()
    app = build_app(state)

    async def watch_signals():
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if state.status == "draining":
                    log.warning("second signal: exiting now")
                    os._exit(1)
                state.status = "draining"  # /health 503, new requests 503
                log.info("shutting down: draining for up to %.0fs", config.drain_timeout_s)
                http.start_soon(drain_then_stop)

    async def drain_then_stop():
        loop = state.loop
        with anyio.move_on_after(config.drain_timeout_s):
            while loop.tracked:
                await anyio.sleep(0.05)
        if loop.tracked:  # leftovers end with an error frame, then [DONE]
            log.warning("drain deadline: failing %d requests", len(loop.tracked))
            loop.fail_all("the server is shutting down")
            await anyio.sleep(0.5)  # let the writers flush their last frames
        stop.set()

    async with anyio.create_task_group() as tg:
        await tg.start(state.loop.run)
        async with anyio.create_task_group() as http:
            http.start_soon(watch_signals)
            state.status = "ok"
            if ready is not None:
                ready(config.port)
            log.info("serving %s on http://%s:%d", state.model_name, config.host, config.port)
            served = anyio.Event()

            async def run_http():
                # hypercorn in a task of its own: it leaves asyncio cancellation state behind
                # on the task that ran it, which would confuse this task's cancel scopes.
                try:
                    await hypercorn_serve(app, hconfig, shutdown_trigger=stop.wait)
                finally:
                    served.set()

            http.start_soon(run_http)
            await served.wait()
            http.cancel_scope.cancel()
        state.loop.stop()  # returns once the requests still in the engine are done
