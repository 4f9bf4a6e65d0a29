"""Request fields that constrain the output -> SamplingParams.structured_outputs.

Three vocabularies name the same constraints: OpenAI's `response_format`, vLLM's
`structured_outputs` object, and vLLM's older `guided_*` fields. Each maps onto one
StructuredOutputs whose `field` is the request field it came from, so an invalid schema,
regex or grammar found by the grammar engine (when the request is added) is a 400 naming it.
A request may ask for one constraint: two are a 400 naming the second.

The fields arrive undecoded (protocol.Checked); they are decoded here, where each error can
name its field.
"""

import re

import msgspec

from vtllm.errors import InvalidParameter
from vtllm.scheduler.sampling_params import StructuredOutputs
from vtllm.server.partial_json import loads

# OpenAI's rule for response_format.json_schema.name (and function names)
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# guided_decoding_backend values that ask for nothing beyond what vtllm does (llguidance)
BACKENDS_ASKING_NOTHING = (None, "", "auto", "guidance", "llguidance")
_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# Whitespace a JSON answer may hold between two tokens, as llama.cpp's JSON grammars bound it:
# one space, or a line break or two and an indent. Unbounded, a small model can spend its
# whole max_tokens on blank lines inside an object the grammar cannot let it leave.
WHITESPACE = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}
ANY_OBJECT = {"type": "object"}
_ANY = msgspec.json.Decoder()


def decoded(raw: msgspec.Raw, name: str):
    """An undecoded field's value (None when not sent); a number out of range names it."""
    if not len(raw):
        return None
    try:
        return _ANY.decode(raw)
    except msgspec.ValidationError:
        raise InvalidParameter(f"{name}: not a valid JSON value", param=name) from None


def structured_outputs(req) -> StructuredOutputs | None:
    """The one constraint the request asks for (None: free text)."""
    found: list[StructuredOutputs] = []
    fmt = _response_format(decoded(req.response_format, "response_format"))
    if fmt is not None:
        found.append(fmt)
    so = _structured_outputs_object(decoded(req.structured_outputs, "structured_outputs"))
    if so is not None:
        found.append(so)
    for kind, name in (
        ("json", "guided_json"),
        ("regex", "guided_regex"),
        ("choice", "guided_choice"),
        ("grammar", "guided_grammar"),
    ):
        value = decoded(getattr(req, name), name)
        if value is not None:
            found.append(_one(kind, value, name))
    backend = decoded(req.guided_decoding_backend, "guided_decoding_backend")
    if backend not in BACKENDS_ASKING_NOTHING:
        raise InvalidParameter(
            "guided_decoding_backend: only llguidance is available (leave it unset or 'auto')",
            param="guided_decoding_backend",
        )
    if decoded(req.guided_whitespace_pattern, "guided_whitespace_pattern") is not None:
        raise InvalidParameter(
            "guided_whitespace_pattern is not supported", param="guided_whitespace_pattern"
        )
    if len(found) > 1:
        second = found[1].field
        raise InvalidParameter(
            f"{second}: one output constraint per request ({found[0].field} is one already)",
            param=second,
        )
    return found[0] if found else None


def _response_format(value) -> StructuredOutputs | None:
    name = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidParameter(f"{name} must be an object with a 'type'", param=name)
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json=bounded(ANY_OBJECT), field=name)
    if kind != "json_schema":
        raise InvalidParameter(
            f"{name}.type must be one of text, json_object, json_schema", param=f"{name}.type"
        )
    spec = value.get("json_schema")
    param = f"{name}.json_schema"
    if not isinstance(spec, dict):
        raise InvalidParameter(f"{param} must be an object", param=param)
    if not isinstance(spec.get("name"), str) or not NAME.fullmatch(spec["name"]):
        raise InvalidParameter(
            f"{param}.name must be 1 to 64 letters, digits, '_' or '-'", param=f"{param}.name"
        )
    if not isinstance(spec.get("strict", False), bool | None):
        raise InvalidParameter(f"{param}.strict must be a boolean", param=f"{param}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise InvalidParameter(f"{param}.schema must be a JSON schema object", param=name)
    # strict or not, the schema is enforced: the grammar engine knows no looser mode
    return StructuredOutputs(json=bounded(schema), field=name)


def _structured_outputs_object(value) -> StructuredOutputs | None:
    name = "structured_outputs"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidParameter(f"{name} must be an object", param=name)
    unknown = [k for k in value if k not in _KINDS]
    if unknown:
        raise InvalidParameter(
            f"{name}: unsupported key (one of {', '.join(_KINDS)})", param=f"{name}.{unknown[0]}"
        )
    kinds = [k for k in _KINDS if value.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise InvalidParameter(f"{name} must set exactly one of {', '.join(_KINDS)}", param=name)
    kind = kinds[0]
    if kind == "json_object":
        if value[kind] is not True:
            raise InvalidParameter(f"{name}.json_object must be a boolean", param=name)
        return StructuredOutputs(json=bounded(ANY_OBJECT), field=name)
    return _one(kind, value[kind], name)


def _one(kind: str, value, name: str) -> StructuredOutputs:
    if kind == "json":
        if not isinstance(value, dict | str):
            raise InvalidParameter(f"{name} must be a JSON schema (object or text)", param=name)
        value = bounded(value)
    elif kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidParameter(f"{name} must be a non-empty list of strings", param=name)
    elif not isinstance(value, str) or not value:
        raise InvalidParameter(f"{name} must be a non-empty string", param=name)
    return StructuredOutputs(**{kind: value}, field=name)


def bounded(schema: dict | str) -> dict | str:
    """The schema with WHITESPACE, unless it sets the grammar engine's options itself (or
    is text that does not decode: the engine names the field in its refusal)."""
    if isinstance(schema, str):
        decoded_schema = loads(schema)
        if not isinstance(decoded_schema, dict):
            return schema
        schema = decoded_schema
    if "x-guidance" in schema:
        return schema
    return {**schema, "x-guidance": WHITESPACE}
