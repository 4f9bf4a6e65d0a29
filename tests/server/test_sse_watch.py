"""SSEResponse's watcher: a stalled send is cut off at the stall deadline (not earlier, not
much later), pings are asked for only while nothing is being sent, and the watcher sleeps
between deadlines instead of spinning."""

import anyio
import pytest

from vtllm.server.sse import SSEResponse


class Sends:
    """An ASGI send whose n-th body message (0-based) never returns."""

    def __init__(self, stall_at: int | None):
        self.stall_at = stall_at
        self.bodies: list[bytes] = []
        self.finished = False

    async def __call__(self, message):
        if message["type"] != "http.response.body":
            return
        if not message["more_body"]:
            self.finished = True
            return
        if len(self.bodies) == self.stall_at:
            await anyio.sleep_forever()
        self.bodies.append(message["body"])


def _run(events, sends, **kw):
    calls = {"stall": 0, "idle": 0, "clock": 0}
    clock = anyio.current_time

    def counted_clock():
        calls["clock"] += 1
        return clock()

    def on_stall():
        calls["stall"] += 1

    def on_idle():
        calls["idle"] += 1

    async def main():
        response = SSEResponse(events(), on_stall=on_stall, on_idle=on_idle, **kw)
        started = clock()
        await response.stream_response(sends)
        return clock() - started

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anyio, "current_time", counted_clock)
        took = anyio.run(main)
    return took, calls


def test_a_stalled_send_is_cut_off_at_the_deadline_without_pings_or_spinning():
    async def events():
        for i in range(3):
            yield b"frame %d" % i

    sends = Sends(stall_at=1)
    took, calls = _run(events, sends, stall_timeout_s=0.4, idle_s=0.05)
    assert sends.bodies == [b"frame 0"] and not sends.finished
    assert calls["stall"] == 1
    assert 0.4 <= took < 1.5, took
    assert calls["idle"] == 0  # never a ping while a send is in flight
    assert calls["clock"] < 40, calls  # one look per idle_s at most, not a busy loop


def test_pings_are_asked_for_while_the_stream_waits_and_not_while_it_sends():
    async def events():
        yield b"first"
        await anyio.sleep(0.35)  # the generator waits for the engine: pings are due
        yield b"last"

    sends = Sends(stall_at=None)
    took, calls = _run(events, sends, stall_timeout_s=5.0, idle_s=0.1)
    assert sends.bodies == [b"first", b"last"] and sends.finished
    assert calls["stall"] == 0
    assert 2 <= calls["idle"] <= 4, calls  # ~0.35 s of waiting at one ping per 0.1 s
    assert took < 1.0, took


def test_a_failing_send_raises_its_own_error_not_a_group():
    async def events():
        yield b"frame"

    async def send(message):
        if message["type"] == "http.response.body":
            raise OSError("connection reset")

    async def main():
        await SSEResponse(events(), stall_timeout_s=5.0).stream_response(send)

    with pytest.raises(OSError, match="connection reset"):  # starlette turns it into a disconnect
        anyio.run(main)
