"""Twenty JSON schemas for the structured-output tests: nested objects, arrays, enums,
numbers with bounds, required fields. Strings and arrays are bounded so that an answer fits
a small max_tokens whatever the model's wishes, and objects are closed (no properties but
those named: JSON Schema's default lets a model add keys until max_tokens)."""

_S = {"type": "string", "maxLength": 12}

SCHEMAS = {
    "point": {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    "flag": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
    "colour": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    },
    "percent": {
        "type": "object",
        "properties": {"value": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["value"],
    },
    "dice": {
        "type": "object",
        "properties": {"roll": {"type": "integer", "minimum": 1, "maximum": 6}},
        "required": ["roll"],
    },
    "person": {
        "type": "object",
        "properties": {
            "name": _S,
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": ["string", "null"], "maxLength": 20},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _S, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    "scores": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 2,
        "maxItems": 4,
    },
    "address": {
        "type": "object",
        "properties": {
            "street": _S,
            "city": _S,
            "geo": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
            },
        },
        "required": ["city", "geo"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 99999},
            "items": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": _S,
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["id", "items"],
    },
    "status": {
        "type": "object",
        "properties": {
            "state": {"enum": ["queued", "running", "done"]},
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["state", "progress"],
    },
    "matrix": {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
        "minItems": 2,
        "maxItems": 2,
    },
    "const": {
        "type": "object",
        "properties": {"version": {"const": 2}, "kind": {"const": "report"}},
        "required": ["version", "kind"],
    },
    "choice": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]},
    "temperature": {
        "type": "object",
        "properties": {
            "celsius": {"type": "number", "exclusiveMinimum": -273.15, "maximum": 60},
            "unit": {"enum": ["C"]},
        },
        "required": ["celsius", "unit"],
    },
    "book": {
        "type": "object",
        "properties": {
            "title": _S,
            "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
            "author": {
                "type": "object",
                "properties": {"first": _S, "last": _S},
                "required": ["last"],
                "additionalProperties": False,
            },
        },
        "required": ["title", "year", "author"],
        "additionalProperties": False,
    },
    "defs": {
        "type": "object",
        "$defs": {"pair": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
        "properties": {"a": {"$ref": "#/$defs/pair"}, "b": {"$ref": "#/$defs/pair"}},
        "required": ["a", "b"],
    },
    "weekday": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
    "rating": {
        "type": "object",
        "properties": {
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "verified": {"type": "boolean"},
            "labels": {
                "type": "array",
                "items": {"enum": ["fast", "cheap", "good"]},
                "maxItems": 3,
            },
        },
        "required": ["stars", "verified", "labels"],
    },
    "nullable": {
        "type": "object",
        "properties": {"note": {"anyOf": [{"type": "null"}, _S]}},
        "required": ["note"],
    },
}


def _closed(schema):
    if isinstance(schema, dict):
        if "properties" in schema:
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            _closed(value)
    elif isinstance(schema, list):
        for value in schema:
            _closed(value)
    return schema


_closed(SCHEMAS)
