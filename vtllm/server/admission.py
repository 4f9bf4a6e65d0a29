"""Admission control: a full queue answers 429 with a Retry-After from the drain rate, before
the request is tokenized; API keys are checked on the path the router uses."""

import hmac
import math
import time
from collections import deque
from time import perf_counter

from vtllm.server.http_errors import HttpError, error_response


class DrainRate:
    """Requests finished per second over the last minute (samples of the loop's counter)."""

    def __init__(self, window_s: float = 60.0):
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def retry_after(self, num_finished: int, num_waiting: int) -> int:
        now = time.monotonic()
        self.samples.append((now, num_finished))
        while self.samples and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        t0, n0 = self.samples[0]
        rate = (num_finished - n0) / (now - t0) if now > t0 else 0.0
        if rate <= 0:
            return 5
        return max(1, min(60, math.ceil(num_waiting / rate)))


def admit(state) -> None:
    """Raise 503 while not serving, 429 when the queue is full."""
    if state.status != "ok":
        raise HttpError(503, f"the server is {state.status}", type_="service_unavailable")
    num_waiting = state.engine.num_waiting
    if num_waiting >= state.config.max_queued_requests:
        raise _queue_full(state, "requests", num_waiting)


def _queue_full(state, what: str, num_waiting: int) -> HttpError:
    seconds = state.drain.retry_after(state.engine.num_finished, num_waiting)
    return HttpError(
        429,
        f"too many {what} are waiting; retry later",
        type_="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(seconds)},
    )


def admit_prompt_tokens(state, num_tokens: int) -> None:
    """429 when the waiting queue already holds VT_MAX_QUEUED_PROMPT_TOKENS: a few huge
    prompts are as much queued work as many short ones, and the count cap alone would let
    256 context-length prompts wait. Checked once the prompt is tokenized (its length is not
    known before); a request that finds the queue empty always queues, so one longer than
    the cap can still be served. O(waiting), bounded by VT_MAX_QUEUED_REQUESTS."""
    engine = state.engine
    if not engine.num_waiting:
        return
    queued = engine.num_waiting_prompt_tokens()
    if queued + num_tokens > state.config.max_queued_prompt_tokens:
        raise _queue_full(state, "prompt tokens", engine.num_waiting)


OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})


class ApiKeyMiddleware:
    """Pure ASGI: checks `Authorization: Bearer KEY` in constant time on every path but the
    open ones, using the same normalized path the router matches."""

    def __init__(self, app, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send):
        open_path = scope["path"].rstrip("/") in OPEN_PATHS
        if scope["type"] != "http" or open_path or scope["method"] == "OPTIONS":  # CORS preflight
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        ok = hmac.compare_digest(token.strip() if scheme.lower() == b"bearer" else b"", self.key)
        if not ok:
            response = error_response(
                401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
            )
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


MAX_HEADERS = 128


class HeaderLimitMiddleware:
    """431 for requests with too many headers (their total size is capped by hypercorn's
    h11_max_incomplete_size, which answers 431 itself)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and len(scope["headers"]) > MAX_HEADERS:
            response = error_response(
                431, f"more than {MAX_HEADERS} headers", "invalid_request_error"
            )
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


DISCONNECTED_AT = "vt.disconnected_at"  # scope key: perf_counter when the client went away


class DisconnectClockMiddleware:
    """Stamps the moment the server sees `http.disconnect` into the scope, so the abort that
    follows can be timed (vt:request_disconnect_to_abort_seconds)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def timed_receive():
            message = await receive()
            if message["type"] == "http.disconnect" and DISCONNECTED_AT not in scope:
                scope[DISCONNECTED_AT] = perf_counter()
            return message

        return await self.app(scope, timed_receive, send)
