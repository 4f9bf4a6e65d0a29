"""Server-sent events: one `data:` frame per JSON chunk, `[DONE]` last."""

from vtllm.server.protocol import encoder

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


def frame(obj) -> bytes:
    return b"data: " + encoder.encode(obj) + b"\n\n"
