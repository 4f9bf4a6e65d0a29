"""Server-sent events: one `data:` frame per JSON chunk, `[DONE]` last.

A client that stops reading must not hold its request for ever. hypercorn's send() waits on
asyncio's drain(), so once the kernel send buffer and the transport's 64 KiB high-water mark
are full, the ASGI send stalls (checked by tests/reliability/test_stream_faults.py). While it
stalls the step loop keeps generating into the request's mailbox, which merges into one
pending update (at most max_tokens tokens). SSEResponse bounds the stall itself: a send that
makes no progress for VT_SERVER_WRITE_STALL_TIMEOUT_S aborts the request, which frees its KV
blocks, and closes the connection.

Both deadlines a stream has, the stall and the keep-alive ping, are kept by one watcher task a
response that sleeps until the nearer one: a token's send only stamps the clock. (A cancel
scope a send, and one a mailbox wait, would cost a sizeable share of the event loop's time
per streamed token with many streams: bench/host_cost_serve.py.)
"""

import logging

import anyio
from starlette.responses import StreamingResponse

from vtllm.server.protocol import encoder

log = logging.getLogger("vtllm.server")

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


def frame(obj) -> bytes:
    return b"data: " + encoder.encode(obj) + b"\n\n"


class FrameFault:
    """VT_DEBUG_FAULTS (fault F20): the serialisation of a coming frame fails part-way, as a
    chunk holding a value the encoder cannot write would."""

    def __init__(self):
        self.countdown = 0  # > 0: the frame that brings it to 0 raises

    def frame(self, obj) -> bytes:
        if self.countdown > 0:
            self.countdown -= 1
            if self.countdown == 0:
                return frame([obj, object()])  # encodes obj, then raises TypeError
        return frame(obj)


class SSEResponse(StreamingResponse):
    """A StreamingResponse whose every send has a deadline, and whose event generator is
    always closed before the response returns (its `finally` aborts the request), whether
    the stream ended, the client left, or the client stopped reading. `on_idle` is called when
    nothing was sent for `idle_s` seconds (the caller then yields a keep-alive frame)."""

    def __init__(self, events, *, stall_timeout_s: float, on_stall=None, idle_s=None, on_idle=None):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.stall_timeout_s = stall_timeout_s
        self.on_stall = on_stall
        self.idle_s = idle_s if on_idle is not None else None
        self.on_idle = on_idle
        self._send_started: float | None = None  # clock at the start of the send in flight
        self._last_send = 0.0  # clock at the start of the latest send
        self._stalled = False

    async def stream_response(self, send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        events = self.body_iterator
        try:
            try:
                await self._send_all(send, events)
            except BaseExceptionGroup as group:  # anyio wraps what the send loop raised
                if len(group.exceptions) == 1:  # bare, as starlette expects it (OSError)
                    raise group.exceptions[0] from None
                raise
            if self._stalled:
                log.warning("client read nothing for %.1fs: aborting", self.stall_timeout_s)
                if self.on_stall is not None:
                    self.on_stall()
                # Returning without the last body message makes hypercorn close the
                # connection; the kernel's TCP_USER_TIMEOUT then resets it (engine.py).
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # Deterministic: a generator left suspended at a yield (send stalled, or was
            # cancelled by a disconnect) would otherwise abort its request only when collected.
            await events.aclose()

    async def _send_all(self, send, events) -> None:
        """Sends every frame, the watcher beside the sends; stops early on a stall."""
        clock = anyio.current_time
        async with anyio.create_task_group() as tg:
            self._last_send = clock()
            tg.start_soon(self._watch, tg.cancel_scope)
            async for chunk in events:
                body = {"type": "http.response.body", "body": chunk, "more_body": True}
                self._send_started = self._last_send = clock()
                try:
                    await send(body)
                except TimeoutError:  # ETIMEDOUT: the kernel's backstop (engine.py) came first
                    self._stalled = True
                    break
                self._send_started = None
            tg.cancel_scope.cancel()  # the watcher

    async def _watch(self, scope: anyio.CancelScope) -> None:
        """Cancels `scope` once a send has made no progress for stall_timeout_s; calls
        on_idle once nothing was sent for idle_s. Wakes at those deadlines, and every idle_s
        while a send is in flight (so a ping after a slow send is at most idle_s late)."""
        timeout = self.stall_timeout_s
        while True:
            now = anyio.current_time()
            since = self._send_started
            if since is not None and now - since >= timeout:
                self._stalled = True
                scope.cancel()
                return
            if since is not None:  # a send in flight: no ping, but look again within idle_s
                wake = since + timeout
                if self.idle_s is not None:
                    wake = min(wake, now + self.idle_s)
            else:
                wake = now + timeout
                if self.idle_s is not None:
                    if now - self._last_send >= self.idle_s:
                        self._last_send = now  # the next ping is due idle_s from this one
                        self.on_idle()
                    wake = min(wake, self._last_send + self.idle_s)
            await anyio.sleep(max(wake - now, 0.0))  # never negative, even after rounding
