"""POST /v1/embeddings: OpenAI's shape, served by the embedding model (engine/embedder) that
`--embedding-model` loads beside the chat model, or that `vtllm serve` was given as its model.

input: a string, a list of strings, a list of token ids, or a list of such lists; each is one
embedding, in order. encoding_format: float (lists of numbers) or base64 (the float32 values'
little-endian bytes, as OpenAI's client decodes them). dimensions: the model's own size only
(all-MiniLM-style encoders are not trained to be cut). truncate_prompt_tokens: vLLM's, the last
k tokens of longer inputs; without it an input past the model's length is refused.
"""

import base64
from typing import Literal

import anyio.to_thread
import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vtllm.errors import InvalidParameter, VtllmError
from vtllm.server.http_errors import HttpError
from vtllm.server.protocol import RequestDecoder

# one list type in a union is msgspec's limit: the list's kinds are checked in _sequences
Input = str | list[str | int | list[int]]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: Input
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None


embedding_decoder = RequestDecoder(EmbeddingRequest)


def _sequences(embedder, raw: Input) -> list[list[int]]:
    if isinstance(raw, str):
        return [embedder.encode(raw)]
    if not raw:
        raise InvalidParameter("input must not be empty", param="input")
    for kind in (str, int, list):
        if all(isinstance(x, kind) for x in raw):
            if kind is str:
                return [embedder.encode(text) for text in raw]
            return [list(raw)] if kind is int else [list(ids) for ids in raw]
    raise InvalidParameter(
        "input must be a string, a list of strings, a list of token ids or a list of such lists",
        param="input",
    )


def _check(embedder, req: EmbeddingRequest) -> None:
    if req.dimensions is not None and req.dimensions != embedder.dimensions:
        raise InvalidParameter(
            f"dimensions: this model gives {embedder.dimensions}-dimensional embeddings only",
            param="dimensions",
        )
    k = req.truncate_prompt_tokens
    if k is not None and not 1 <= k <= embedder.max_model_len:
        raise InvalidParameter(
            f"truncate_prompt_tokens must be in [1, {embedder.max_model_len}]",
            param="truncate_prompt_tokens",
        )


async def embeddings(request: Request) -> Response:
    from vtllm.server.routes import _named, _refusal, read_request

    state = request.app.state.vt
    embedder = state.engine.embedder
    try:
        req = await read_request(request, embedding_decoder, "embeddings")
        if embedder is None:
            raise HttpError(
                400,
                "no embedding model is served here (start the server with --embedding-model)",
                type_="invalid_request_error",
                param="model",
            )
        if req.model is not None and req.model != embedder.name:
            raise HttpError(
                404,
                f"the embedding model here is {embedder.name!r}",
                type_="invalid_request_error",
                code="model_not_found",
                param="model",
            )
        _check(embedder, req)
        raw = req.input
        sequences = await anyio.to_thread.run_sync(_sequences, embedder, raw)
        sequences = embedder.check(sequences, req.truncate_prompt_tokens)
    except (VtllmError, ValueError) as exc:
        return _refusal(request, exc)
    vectors = await anyio.to_thread.run_sync(embedder.embed, sequences)
    tokens = sum(len(s) for s in sequences)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    body = {
        "object": "list",
        "data": data,
        "model": embedder.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return _named(request, JSONResponse(body))


def _encode(vector: np.ndarray, encoding_format: str):
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
