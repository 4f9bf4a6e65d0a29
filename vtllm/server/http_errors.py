"""Every failure becomes the OpenAI error envelope with the right status."""

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from vtllm.errors import VtllmError
from vtllm.server.protocol import ErrorBody, ErrorResponse, encoder


class HttpError(VtllmError):
    def __init__(
        self, status: int, message: str, *, type_: str, code=None, param=None, headers=None
    ):
        super().__init__(message, param=param)
        self.status, self.type, self.code, self.headers = status, type_, code, headers


MAX_MESSAGE = 512  # characters: an error never grows with the input that caused it
MAX_PARAM = 128


def _cap(text, limit: int):
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def error_response(status: int, message: str, type_: str, param=None, code=None, headers=None):
    message, param = _cap(message, MAX_MESSAGE), _cap(param, MAX_PARAM)
    body = ErrorResponse(ErrorBody(message=message, type=type_, param=param, code=code))
    return Response(encoder.encode(body), status, headers, media_type="application/json")


def from_exception(exc: Exception) -> Response:
    if isinstance(exc, VtllmError):
        headers = getattr(exc, "headers", None)
        return error_response(exc.status, str(exc), exc.type, exc.param, exc.code, headers)
    if isinstance(exc, msgspec.ValidationError):
        message = str(exc)
        param = message.rsplit("at `$.", 1)[1].rstrip("`") if "at `$." in message else None
        if param is not None:  # msgspec writes dict keys as [...]: name the field itself
            param = param.replace("[...]", "")
        return error_response(400, message, "invalid_request_error", param, "invalid_type")
    if isinstance(exc, msgspec.DecodeError):
        return error_response(
            400, "the body is not valid JSON", "invalid_request_error", code="invalid_json"
        )
    raise exc


def close_if_body_unread(request: Request, response: Response) -> Response:
    """A request refused before its body was read through (a wrong content type, a declared
    length over the cap, admission, a body timeout, an unknown route) leaves bytes on an
    HTTP/1.1 connection that cannot be reused, so the server closes it after the response: the
    response says so, or a keep-alive client would send its next request into the closing
    socket and see the connection drop instead of an answer."""
    if not request.scope.get("http_version", "1.1").startswith("1"):
        return response  # HTTP/2 streams end on their own; the header is not allowed there
    announced = request.headers.get("content-length", "0") != "0"
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if (announced or chunked) and not getattr(request.state, "body_read", False):
        response.headers["connection"] = "close"
    return response


async def http_exception(request: Request, exc: HTTPException) -> Response:
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "error")
    response = error_response(exc.status_code, str(exc.detail), kind, headers=exc.headers)
    return close_if_body_unread(request, response)
