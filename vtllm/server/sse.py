"""Server-sent events: one `data:` frame per JSON chunk, `[DONE]` last.

A client that stops reading must not hold its request for ever. hypercorn's send() waits on
asyncio's drain(), so once the kernel send buffer and the transport's 64 KiB high-water mark
are full, the ASGI send stalls (checked by tests/reliability/test_stream_faults.py). While it
stalls the step loop keeps generating into the request's mailbox, which merges into one
pending update (at most max_tokens tokens). SSEResponse bounds the stall itself: a send that
makes no progress for VT_SERVER_WRITE_STALL_TIMEOUT_S aborts the request, which frees its KV
blocks, and closes the connection.
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
    the stream ended, the client left, or the client stopped reading."""

    def __init__(self, events, *, stall_timeout_s: float, on_stall=None):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.stall_timeout_s = stall_timeout_s
        self.on_stall = on_stall

    async def stream_response(self, send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        events = self.body_iterator
        try:
            async for chunk in events:
                body = {"type": "http.response.body", "body": chunk, "more_body": True}
                try:
                    with anyio.move_on_after(self.stall_timeout_s) as timer:
                        await send(body)
                    stalled = timer.cancelled_caught
                except TimeoutError:  # ETIMEDOUT: the kernel's backstop (engine.py) came first
                    stalled = True
                if stalled:
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
