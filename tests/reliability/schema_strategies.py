"""Hypothesis strategies from the JSON schemas in /openapi.json: mostly well-typed bodies with
edge values (so requests get deep into validation and the engine), and now and then any JSON
at all in a field's place (so every type check is exercised)."""

from hypothesis import strategies as st

EDGE_INTS = [0, 1, -1, 2, 16, 17, 20, 21, 64, 65, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, 2.0, 3.0, -2.0, 1e308, -1e308, 5e-324, 100.0]

any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


ALWAYS = frozenset({"prompt", "messages", "tokens", "role", "content", "type", "text"})


def from_schema(schema: dict, components: dict, *, wild: bool = True):
    """A strategy for values of `schema`; `wild`: sometimes any JSON value instead."""
    valid = _valid(schema, components)
    return st.one_of(valid, valid, valid, valid, any_json) if wild else valid


def request_bodies(schema: dict, components: dict):
    """Whole request bodies: well-typed ones with a few fields set (many reach the engine),
    the same with one field replaced by any JSON, and ones where anything goes anywhere."""
    clean = _valid(schema, components)
    keys = sorted(schema.get("properties", {})) if "properties" in schema else []
    one_off = st.tuples(clean, st.sampled_from(keys or ["x"]), any_json).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    return st.one_of(clean, clean, one_off, any_json)


def _valid(schema: dict, components: dict):
    if "$ref" in schema:
        return st.deferred(lambda: _valid(components[schema["$ref"].rsplit("/", 1)[1]], components))
    if "anyOf" in schema:
        return st.one_of([_valid(s, components) for s in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":  # small values first: most fields accept 0..4
        return st.one_of(st.integers(0, 4), st.integers(-3, 40), st.sampled_from(EDGE_INTS))
    if kind == "number":
        return st.one_of(st.floats(0, 1), st.floats(-5, 5), st.sampled_from(EDGE_FLOATS))
    if kind == "string":
        return st.text(max_size=24) | st.sampled_from(
            ["", "x", "\u0000", "é\U0001f600", "<|im_end|>"]
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), components), max_size=5)
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not props:
            return st.dictionaries(st.text(max_size=10), from_schema(extra, components), max_size=4)
        fields = {k: _valid(v, components) for k, v in props.items()}
        always = {k: v for k, v in fields.items() if k in required or k in ALWAYS}
        optional = sorted(k for k in fields if k not in always)
        # A few optional fields per object: each one set is a chance to be out of range.
        return st.tuples(
            st.fixed_dictionaries(always),
            st.sets(st.sampled_from(optional), max_size=4).flatmap(
                lambda chosen: st.fixed_dictionaries({k: fields[k] for k in sorted(chosen)})
            )
            if optional
            else st.just({}),
        ).map(lambda t: {**t[0], **t[1]})
    return any_json
