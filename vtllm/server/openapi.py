"""GET /openapi.json: the request and response schemas, generated from the msgspec Structs the
routes decode with, so the description cannot drift from what the server accepts."""

from functools import cache

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from vtllm import __version__
from vtllm.server.embeddings import EmbeddingRequest
from vtllm.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    ErrorResponse,
    TokenizeRequest,
)

# (path, summary, request Struct, response Struct or None for a plain JSON object)
OPERATIONS = (
    ("/v1/completions", "Text completion", CompletionRequest, CompletionResponse),
    ("/v1/chat/completions", "Chat completion", ChatCompletionRequest, ChatCompletionResponse),
    ("/tokenize", "Text to token ids", TokenizeRequest, None),
    ("/detokenize", "Token ids to text", DetokenizeRequest, None),
    ("/v1/embeddings", "Embeddings (with --embedding-model)", EmbeddingRequest, None),
)
_REF = "#/components/schemas/{name}"


def _json(schema) -> dict:
    return {"application/json": {"schema": schema}}


@cache
def document() -> bytes:
    types = [t for _, _, req, resp in OPERATIONS for t in (req, resp) if t is not None]
    refs, components = msgspec.json.schema_components([*types, ErrorResponse], ref_template=_REF)
    ref = dict(zip([*types, ErrorResponse], refs, strict=True))
    error = {"description": "an OpenAI error envelope", "content": _json(ref[ErrorResponse])}
    paths = {}
    for path, summary, req, resp in OPERATIONS:
        ok = _json(ref[resp] if resp is not None else {"type": "object"})
        if resp is not None:  # stream=true answers with server-sent events instead
            ok["text/event-stream"] = {"schema": {"type": "string"}}
        paths[path] = {
            "post": {
                "summary": summary,
                "requestBody": {"required": True, "content": _json(ref[req])},
                "responses": {
                    "200": {"description": "success", "content": ok},
                    "4XX": error,
                    "5XX": error,
                },
            }
        }
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "vtllm", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(doc)


async def openapi(_request: Request) -> Response:
    return Response(document(), media_type="application/json")
