"""--data-parallel-size N: one HTTP endpoint in front of N replica servers (each a whole
`vtllm serve` with its own engine, in a process of this host or of a Ray actor's node:
cli/data_parallel.py starts them). This router holds no model: it forwards each request to
the replica with the fewest requests in flight through it, streams the answer back as it comes
(SSE included), sums the replicas' /metrics, and answers /health itself.

- Routing: least in flight; among replicas within ROUTE_SLACK of the least, the one a hash of
  the prompt's start ranks first (rendezvous hashing), so that requests sharing a prefix meet
  the replica that cached it while the load stays even.
- A replica that ends (its engine died: it exits 3, or its process or node is gone) makes the
  router dead: /health and new requests 503, then the router stops the others and exits 3, as
  one server does when its engine dies.
- A client that goes away closes the replica's connection, which aborts the request there.
"""

import hashlib
import logging
import os
import signal
import sys

import anyio
import h11
import msgspec
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from vtllm.engine.watchdog import EXIT_ENGINE_DEAD
from vtllm.server.admission import ApiKeyMiddleware
from vtllm.server.http_errors import error_response

log = logging.getLogger("vtllm.server")

ROUTE_SLACK = 1  # requests in flight a replica may be above the least and still win its prefixes
PREFIX_BYTES = 256  # of the prompt (or messages) as JSON: what the prefix hash sees
REPLICA_HEADER = "x-vtllm-data-parallel-rank"  # which replica answered, for operators and tests
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"host", b"content-length"}
READ_BYTES = 64 * 1024


class RouterState:
    def __init__(self, replicas, config):
        self.replicas = replicas  # each: .host, .port, .failure() -> str | None, .stop()
        self.config = config
        self.in_flight = [0] * len(replicas)
        self.num_routed = [0] * len(replicas)
        self.status = "ok"  # ok | draining | dead

    def pick(self, body: bytes) -> int:
        least = min(self.in_flight)
        near = [i for i, n in enumerate(self.in_flight) if n <= least + ROUTE_SLACK]
        key = _prefix_key(body)
        if key is None:
            return min(near, key=lambda i: (self.in_flight[i], self.num_routed[i]))
        return max(near, key=lambda i: hashlib.blake2b(key + bytes([i]), digest_size=8).digest())


def _prefix_key(body: bytes) -> bytes | None:
    try:
        request = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(request, dict):
        return None
    prompt = request.get("messages") or request.get("prompt") or request.get("input")
    return None if prompt is None else msgspec.json.encode(prompt)[:PREFIX_BYTES]


# -- a streaming HTTP/1.1 client on h11 (hypercorn's own protocol library) ----------------------
class Upstream:
    """One request to a replica over its own connection (closed at the end, or when the client
    goes, which aborts the request in the replica)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.conn = h11.Connection(h11.CLIENT)
        self.stream = None

    async def send(self, method: str, target: str, headers: list, body: bytes) -> h11.Response:
        self.stream = await anyio.connect_tcp(self.host, self.port)
        headers = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        headers += [
            (b"host", f"{self.host}:{self.port}".encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        request = h11.Request(method=method, target=target, headers=headers)
        data = self.conn.send(request) + self.conn.send(h11.Data(data=body))
        await self.stream.send(data + self.conn.send(h11.EndOfMessage()))
        return await self._next()

    async def chunks(self):
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return

    async def _next(self):
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive(READ_BYTES)
                except anyio.EndOfStream:
                    data = b""
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the replica closed the connection mid-answer")
            return event

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


async def fetch(host: str, port: int, path: str, headers=()) -> tuple[int, bytes]:
    upstream = Upstream(host, port)
    try:
        response = await upstream.send("GET", path, list(headers), b"")
        body = b"".join([chunk async for chunk in upstream.chunks()])
        return response.status_code, body
    finally:
        await upstream.aclose()


# -- routes -------------------------------------------------------------------------------------
async def proxy(request: Request) -> Response:
    state: RouterState = request.app.state.router
    if state.status != "ok":
        return error_response(503, f"the server is {state.status}", "service_unavailable")
    body = await request.body()
    if len(body) > state.config.max_body_bytes:
        return error_response(413, "request body too large", "invalid_request_error")
    index = state.pick(body)
    replica = state.replicas[index]
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    upstream = Upstream(replica.host, replica.port)
    state.in_flight[index] += 1
    state.num_routed[index] += 1
    try:
        response = await upstream.send(request.method, target, request.headers.raw, body)
    except (OSError, ConnectionError) as exc:
        state.in_flight[index] -= 1
        await upstream.aclose()
        log.error("data-parallel replica %d unreachable: %s", index, exc)
        return error_response(503, "a data-parallel replica is unreachable", "service_unavailable")

    async def relay():
        try:
            async for chunk in upstream.chunks():
                yield chunk
        finally:
            state.in_flight[index] -= 1
            with anyio.CancelScope(shield=True):
                await upstream.aclose()

    reply = StreamingResponse(relay(), status_code=response.status_code)
    headers = [(k, v) for k, v in response.headers if k.lower() not in HOP_BY_HOP]
    reply.raw_headers = [*headers, (REPLICA_HEADER.encode(), str(index).encode())]
    return reply


async def health(request: Request) -> Response:
    return Response(status_code=200 if request.app.state.router.status == "ok" else 503)


async def metrics(request: Request) -> Response:
    """Every replica's /metrics, summed sample by sample (a usage share averaged)."""
    state: RouterState = request.app.state.router
    auth = [(k, v) for k, v in request.headers.raw if k.lower() == b"authorization"]
    texts = []
    for replica in state.replicas:
        try:
            status, body = await fetch(replica.host, replica.port, "/metrics", auth)
        except OSError:
            continue
        if status == 200:
            texts.append(body.decode())
    return Response(sum_metrics(texts), media_type="text/plain; version=0.0.4; charset=utf-8")


def sum_metrics(texts: list[str]) -> str:
    families: dict[str, tuple[str, str, dict]] = {}  # name -> (type, help, sample key -> values)
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, {})
            )
            for s in family.samples:
                if s.name.endswith("_created"):  # a timestamp: nothing to sum
                    continue
                samples.setdefault((s.name, tuple(sorted(s.labels.items()))), []).append(s.value)
    lines = []
    for name, (kind, doc, samples) in families.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for (sample, labels), values in samples.items():
            value = sum(values) / len(values) if "usage_perc" in sample else sum(values)
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{sample}{{{text}}} {value!r}" if text else f"{sample} {value!r}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def build_router_app(state: RouterState) -> Starlette:
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/{path:path}", proxy, methods=methods),
        ]
    )
    app.state.router = state
    if state.config.api_key:  # the replicas check it too; the router guards /metrics
        app.add_middleware(ApiKeyMiddleware, key=state.config.api_key)
    return app


# -- the task tree ------------------------------------------------------------------------------
async def serve_router(state: RouterState) -> None:
    """Serves until SIGINT/SIGTERM (the replicas drain, then the router stops) or a replica's
    end (exit 3)."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    config = state.config
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.errorlog.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    hconfig.read_timeout = None  # as serve(): a waiting client is not idle
    hconfig.graceful_timeout = 5.0
    stop = anyio.Event()

    async def watch_replicas():
        while state.status != "dead":
            for i, replica in enumerate(state.replicas):
                reason = await anyio.to_thread.run_sync(replica.failure)
                if reason is not None and state.status == "ok":
                    state.status = "dead"  # /health 503, new requests 503
                    log.error("data-parallel replica %d ended: %s", i, reason)
                    await anyio.sleep(1.0)  # let the writers flush what they have
                    stop.set()
                    return
            await anyio.sleep(0.5)

    async def watch_signals():
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if state.status == "draining":
                    os._exit(1)
                state.status = "draining"
                log.info("shutting down: the replicas drain")
                await anyio.to_thread.run_sync(_stop_all, state.replicas)
                stop.set()

    served = anyio.Event()

    async def run_http():
        # in a task of its own, as serve() runs it: hypercorn leaves asyncio cancellation state
        # behind on the task that ran it
        try:
            await hypercorn_serve(build_router_app(state), hconfig, shutdown_trigger=stop.wait)
        finally:
            served.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_replicas)
        tg.start_soon(watch_signals)
        tg.start_soon(run_http)
        log.info(
            "serving %d data-parallel replicas on http://%s:%d",
            len(state.replicas),
            config.host,
            config.port,
        )
        await served.wait()
        tg.cancel_scope.cancel()
    if state.status == "dead":
        _stop_all(state.replicas)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_ENGINE_DEAD)


def _stop_all(replicas) -> None:
    for replica in replicas:  # SIGTERM to all first: they drain side by side
        replica.stop(wait=False)
    for replica in replicas:
        replica.stop(wait=True)
