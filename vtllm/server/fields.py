"""The request surface past the sampling settings: each field a client may send is honoured,
refused with a 400 that names it, or, when no API defines it, ignored out loud.

- Fields OpenAI or vLLM define that vtllm does not honour yet (protocol.Unsupported) are
  refused when their value asks for something; the values that ask for nothing (null, false,
  an empty list, `{"type": "text"}`) pass, since some client libraries send defaults always.
- Fields nobody defined (a typo, another server's extension) follow vLLM: the request runs,
  and the names go to a warning log line and, beyond vLLM, to the `Vtllm-Ignored-Fields`
  response header, so the client sees them too. `strict_request_fields` refuses them instead.
"""

import logging
from functools import cache

import msgspec

from vtllm.errors import InvalidParameter
from vtllm.server.protocol import Unsupported

IGNORED_HEADER = "Vtllm-Ignored-Fields"
MAX_NAMED = 16  # names in the header and the log line
MAX_NAME_CHARS = 64
MAX_PROMPT_LOGPROBS = 20

log = logging.getLogger("vtllm.server")

_TOOLS = "only tools and tool_choice (the current names) are supported"
_SAMPLING = "not supported yet"
_CHAT = "not supported yet (the chat template renders the messages alone)"
_OUTPUT = "only text output is supported"
_STORED = "stored completions are not supported"

# field -> (the values that ask for nothing, why another value is refused)
DEFAULTS: dict[str, tuple[tuple, str]] = {
    "functions": ((None, []), _TOOLS),
    "function_call": ((None, "none"), _TOOLS),
    "logits_processors": ((None, []), _SAMPLING),
    "use_beam_search": ((None, False), _SAMPLING),
    "length_penalty": ((None, 1.0), _SAMPLING),
    "spaces_between_special_tokens": ((None, True), _SAMPLING),
    "return_tokens_as_token_ids": ((None, False), _SAMPLING),
    "return_token_ids": ((None, False), _SAMPLING),
    "cache_salt": ((None,), _SAMPLING),
    "kv_transfer_params": ((None,), _SAMPLING),
    "vllm_xargs": ((None, {}), _SAMPLING),
    "request_id": ((None,), _SAMPLING),
    "suffix": ((None, ""), _SAMPLING),
    "chat_template": ((None,), _CHAT),
    "documents": ((None, []), _CHAT),
    "mm_processor_kwargs": ((None, {}), _CHAT),
    "echo": ((None, False), _CHAT),
    "modalities": ((None, ["text"]), _OUTPUT),
    "audio": ((None,), _OUTPUT),
    "prediction": ((None,), _SAMPLING),
    "reasoning_effort": ((None,), _SAMPLING),
    "verbosity": ((None, "medium"), _SAMPLING),
    "web_search_options": ((None,), _SAMPLING),
    "store": ((None, False), _STORED),
    "metadata": ((None, {}), _STORED),
    "service_tier": ((None, "auto", "default"), "service tiers are not supported"),
}
_SHORT = 256  # bytes: a longer value is not a default, and is refused without decoding it
_ANY = msgspec.json.Decoder()


def _same(value, default) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):  # false is not 0
        return type(value) is type(default) and value == default
    return value == default


def _asks_for_nothing(raw: msgspec.Raw, accepted: tuple) -> bool:
    if len(raw) > _SHORT:
        return False
    try:
        value = _ANY.decode(raw)
    except msgspec.ValidationError:  # a number out of range
        return False
    return any(_same(value, d) for d in accepted)


@cache
def _declared(struct: type) -> tuple[str, ...]:
    """The struct's Unsupported fields (`echo` is one on chat, honoured on completions)."""
    fields = msgspec.structs.fields(struct)
    return tuple(f.name for f in fields if f.type == Unsupported and f.name in DEFAULTS)


def refuse_unsupported(req) -> None:
    """400 naming the first field that asks for what vtllm does not do yet."""
    for name in _declared(type(req)):
        raw = getattr(req, name)
        if len(raw):  # empty: not sent
            accepted, why = DEFAULTS[name]
            if not _asks_for_nothing(raw, accepted):
                raise InvalidParameter(f"{name}: {why}", param=name)
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        raise InvalidParameter("best_of other than n is not supported", param="best_of")
    prompt_logprobs = getattr(req, "prompt_logprobs", None)
    if prompt_logprobs is not None:
        if not 0 <= prompt_logprobs <= MAX_PROMPT_LOGPROBS:
            raise InvalidParameter(
                f"prompt_logprobs must be in [0, {MAX_PROMPT_LOGPROBS}]", param="prompt_logprobs"
            )
        if req.stream:
            raise InvalidParameter(
                "prompt_logprobs is not available with stream=true", param="prompt_logprobs"
            )


def _shown(name: str) -> str:
    """A name as a header value and a log line may carry it: short, printable, no commas."""
    name = name[:MAX_NAME_CHARS]
    return "".join(c if "!" <= c <= "~" and c != "," else "?" for c in name) or '""'


def ignore_unknown(names: list[str], *, strict: bool, route: str) -> str | None:
    """The header value naming fields no API defines (None: there are none); logged once per
    request. With `strict`, a 400 naming the first of them instead."""
    if not names:
        return None
    shown = [_shown(n) for n in names[:MAX_NAMED]]
    if strict:
        raise InvalidParameter(
            "unknown field: this server refuses fields no API defines (strict_request_fields)",
            param=shown[0],
        )
    if len(names) > MAX_NAMED:
        shown.append("...")
    value = ",".join(shown)
    log.warning("%s: ignored unknown request fields: %s", route, value)
    return value
