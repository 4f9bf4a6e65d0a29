"""The starlette application: routes, the error envelope for 404/405 and uncaught failures."""

import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from vtllm.config import EngineConfig
from vtllm.engine.engine import Engine
from vtllm.server import routes
from vtllm.server.admission import (
    ApiKeyMiddleware,
    DisconnectClockMiddleware,
    DrainRate,
    HeaderLimitMiddleware,
)
from vtllm.server.embeddings import embeddings
from vtllm.server.fields import IGNORED_HEADER
from vtllm.server.http_errors import error_response, http_exception
from vtllm.server.metrics import metrics
from vtllm.server.openapi import openapi


@dataclass(slots=True)
class ServerState:
    engine: Engine
    tokenizer: object
    model_name: str
    vocab_size: int
    max_model_len: int
    config: EngineConfig
    model_names: tuple[str, ...] = ()  # every name a request may give; model_name is the first
    status: str = "loading"  # loading | ok | draining | dead
    started: int = field(default_factory=lambda: int(time.time()))
    drain: DrainRate = field(default_factory=DrainRate)
    faults: tuple | None = None  # (FaultyBackend, BlockHog) with VT_DEBUG_FAULTS
    frame_fault: object | None = None  # sse.FrameFault with VT_DEBUG_FAULTS


async def _internal_error(_request, _exc):
    return error_response(500, "internal server error", "internal_error")


def build_app(state: ServerState) -> Starlette:
    app = Starlette(
        routes=[
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/version", routes.version, methods=["GET"]),
            Route("/tokenize", routes.tokenize, methods=["POST"]),
            Route("/detokenize", routes.detokenize, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_exception, Exception: _internal_error},
    )
    if state.faults is not None:
        from vtllm.server.debug import fault

        app.router.routes.append(Route("/debug/fault", fault, methods=["POST"]))
    app.state.vt = state
    config = state.config
    if config.cors_origins:
        origins = [o.strip() for o in config.cors_origins.split(",") if o.strip()]
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=[IGNORED_HEADER],  # a browser client may read what was ignored
        )
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, key=config.api_key)
    app.add_middleware(DisconnectClockMiddleware)
    app.add_middleware(HeaderLimitMiddleware)  # outermost: before any other work
    return app
