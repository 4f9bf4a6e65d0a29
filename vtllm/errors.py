"""Typed user errors. A leaf module every package may import.

Each error names the field (param) or file at fault; the CLI prints `str(err)` on one line
and exits 2, the server maps `status`, `type` and `code` onto the OpenAI error envelope.
"""


class VtllmError(Exception):
    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class InvalidParameter(VtllmError, ValueError):
    """A request or sampling field is out of range or of the wrong type."""


class ContextLengthExceeded(VtllmError, ValueError):
    code = "context_length_exceeded"


class ModelLoadError(VtllmError):
    """The model file is missing, unreadable, corrupt or of an unsupported kind."""

    status = 500
    type = "model_load_error"


class UnsupportedModel(ModelLoadError):
    """The architecture or a tensor's quantization type has no implementation here."""


class RequestRejected(VtllmError):
    """The request can never be served by this engine (e.g. larger than the whole KV cache)."""
