"""POST /debug/fault, served only with VT_DEBUG_FAULTS: arms a fault inside the engine.

{"kind": "raise", "steps": 1}      the next collected step raises (forward/sampler failure)
{"kind": "hang"}                   collected steps block until released (watchdog food)
{"kind": "exhaust", "leave_free": 8}  hold KV blocks so only that many stay free
{"kind": "frame_raise", "steps": 3}  the 3rd SSE frame serialised from now raises
{"kind": "release"}                undo hang and exhaust
"""

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vtllm.server.http_errors import error_response


class FaultRequest(msgspec.Struct, kw_only=True):
    kind: str
    steps: int = 1
    leave_free: int = 0


_decoder = msgspec.json.Decoder(FaultRequest)


async def fault(request: Request) -> Response:
    state = request.app.state.vt
    backend, hog = state.faults
    try:
        req = _decoder.decode(await request.body())
    except msgspec.MsgspecError:
        return error_response(400, "body: {kind, steps, leave_free}", "invalid_request_error")
    if req.kind == "raise":
        backend.raise_steps = req.steps
    elif req.kind == "hang":
        backend.released.clear()
        backend.hang.set()
    elif req.kind == "block_loop":
        backend.released.clear()
        backend.block_loop.set()
    elif req.kind == "exhaust":
        hog.leave_free(req.leave_free)
    elif req.kind == "frame_raise":
        state.frame_fault.countdown = req.steps
    elif req.kind == "release":
        backend.release()
        hog.release()
    else:
        return error_response(
            400,
            "kind: raise | hang | block_loop | exhaust | frame_raise | release",
            "invalid_request_error",
        )
    free = state.engine.scheduler.pool.num_free_blocks
    return JSONResponse({"kind": req.kind, "held_blocks": len(hog.held), "free_blocks": free})
