"""The server's task tree: one anyio task group holding the step loop and hypercorn.

SIGINT/SIGTERM turn /health to 503 and stop hypercorn, which lets in-flight responses finish
within its graceful timeout; then the step loop drains and exits.

A dead engine (a step raised, or the watchdog saw no step finish in time) fails its requests,
turns /health to 503, lets the writers send their error frames, and exits with status 3.

Intake: handlers call Engine.submit/abort (vtllm/engine/engine.py) directly instead of going
through an inbox task. They run on the event-loop thread and the scheduler's methods are
synchronous, so each call is atomic with respect to the step loop, exactly as a message handled
by an inbox task would be; the inbox's bound is admit()'s check of the waiting queue (429)
before any tokenizing.
"""

import asyncio
import errno
import logging
import os
import signal
import socket
import sys

import anyio
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from vtllm.config import EngineConfig
from vtllm.engine.engine import Engine
from vtllm.engine.watchdog import EXIT_ENGINE_DEAD, Watchdog
from vtllm.server.app import ServerState, build_app
from vtllm.server.metrics import MetricsObserver
from vtllm.server.sse import FrameFault

log = logging.getLogger("vtllm.server")


class _HypercornConfig(HypercornConfig):
    """Socket options on the listening socket, which accepted connections inherit (Linux):
    a bounded kernel send buffer when asked for, and TCP_USER_TIMEOUT so that the kernel
    resets a connection whose peer has acknowledged nothing for a while (a closed transport
    with unsent data otherwise waits for a reader that never comes). The kernel's timeout is
    a backstop, twice the write-stall timeout plus a second: its clock starts when the peer's
    window closes, earlier than the stalled send that SSEResponse times (asyncio buffers
    64 KiB first), and SSEResponse should see the stall first, to count it. A stream slower
    than 64 KiB per write-stall timeout + 1 s reaches the backstop first: the reset then
    reaches the app as a disconnect, and the request is aborted all the same."""

    send_buffer_bytes = 0
    user_timeout_s = 0.0

    def create_sockets(self):
        sockets = super().create_sockets()
        for sock in sockets.insecure_sockets:
            if self.send_buffer_bytes:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            if self.user_timeout_s and hasattr(socket, "TCP_USER_TIMEOUT"):
                timeout_ms = int(self.user_timeout_s * 1000)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
        return sockets


def _quiet_timed_out_connections(loop, context) -> None:
    """A connection the kernel reset for TCP_USER_TIMEOUT ends hypercorn's connection task
    with ETIMEDOUT, which asyncio would report as an unhandled error with a traceback: it is
    a client that stopped reading, worth one line."""
    exc = context.get("exception")
    if isinstance(exc, TimeoutError) and exc.errno == errno.ETIMEDOUT:  # not asyncio's timeouts
        log.info("a connection timed out: its client stopped reading")
        return
    loop.default_exception_handler(context)


def build_state(config: EngineConfig, *, phases: dict | None = None) -> ServerState:
    engine = Engine.build(config, phases=phases)
    loaded = engine.loaded
    model_names = config.served_model_names or (loaded.name,)
    model_name = model_names[0]  # what responses, logs and metrics say when asked for none
    _ = loaded.tokenizer.max_token_bytes  # computed once now (tens of ms), not on a request
    engine.observer = MetricsObserver(model_name, engine.max_model_len)
    return ServerState(
        engine=engine,
        tokenizer=loaded.tokenizer,
        model_name=model_name,
        model_names=model_names,
        vocab_size=engine.vocab_size,
        max_model_len=engine.max_model_len,
        config=config,
        faults=engine.faults,
        frame_fault=FrameFault() if engine.faults is not None else None,
    )


async def serve(state: ServerState, *, ready=None) -> None:
    """Runs until SIGINT/SIGTERM. `ready(port)` is called once the socket listens."""
    config = state.config
    hconfig = _HypercornConfig()
    hconfig.send_buffer_bytes = config.server_send_buffer_bytes
    hconfig.user_timeout_s = 2 * config.server_write_stall_timeout_s + 1.0
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    # hypercorn's logger through our handler (its own would print each line a second time),
    # warnings and errors only: its one info line, "Running on", repeats our "serving on".
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.errorlog.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    hconfig.h11_max_incomplete_size = 64 * 1024  # request line + headers; beyond: 431
    # No read timeout: hypercorn applies it to every read of the connection, also while the
    # client silently waits for its answer, and on expiry hands the app an http.disconnect,
    # so any generation longer than the timeout was aborted as if the client had left.
    # Slow clients are bounded elsewhere: headers by the keep-alive timeout (a connection is
    # idle until its request line and headers are complete), bodies by read_json's
    # VT_SERVER_BODY_TIMEOUT_S deadline.
    hconfig.read_timeout = None
    hconfig.graceful_timeout = 5.0  # after our own drain (drain_then_stop)
    asyncio.get_running_loop().set_exception_handler(_quiet_timed_out_connections)
    stop = anyio.Event()
    app = build_app(state)
    engine = state.engine
    died = anyio.Event()

    def on_dead(reason: str) -> None:
        state.status = "dead"  # /health 503 and new requests 503 from now on
        log.error("engine dead: %s", reason)
        died.set()

    engine.on_dead = on_dead

    async def stop_when_dead():
        await died.wait()
        await anyio.sleep(1.0)  # let the writers flush their error frames
        stop.set()

    watchdog = None
    if config.engine_iteration_timeout_s > 0:
        watchdog = Watchdog(
            engine.loop,
            config.engine_iteration_timeout_s,
            engine.die,
            call_soon_threadsafe=asyncio.get_running_loop().call_soon_threadsafe,
            grace=max(2.0, config.engine_iteration_timeout_s),
        )
        watchdog.start()

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
        with anyio.move_on_after(config.drain_timeout_s):
            while engine.num_unfinished:
                await anyio.sleep(0.05)
        if engine.num_unfinished:  # leftovers end with an error frame, then [DONE]
            log.warning("drain deadline: failing %d requests", engine.num_unfinished)
            engine.fail_all("the server is shutting down")
            await anyio.sleep(0.5)  # let the writers flush their last frames
        stop.set()

    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)
        async with anyio.create_task_group() as http:
            http.start_soon(watch_signals)
            http.start_soon(stop_when_dead)
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
        if engine.dead is not None:
            tg.cancel_scope.cancel()  # the step loop may sit on a hung step: abandon it
        else:
            engine.stop()  # run returns once the requests still in the engine are done
    if watchdog is not None:
        watchdog.stop()
    if engine.dead is not None:
        # What the invariants need, in one line: nothing held, every request ended once.
        loop = engine.loop
        log.error(
            "engine dead (%s): accepted %d, ended %d, tracked %d, KV blocks in use %d",
            loop.dead,
            loop.num_added,
            loop.num_finished,
            len(loop.tracked),
            loop.scheduler.num_used_blocks,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_ENGINE_DEAD)  # a hung step's thread would block a normal exit
