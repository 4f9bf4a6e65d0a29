"""Where JSON values end in text that may still be growing (a streamed tool call).

The tool-call parsers read a call's `name` as soon as it is whole and hand out its
`arguments` text as it arrives; both need the spans of an object's members before the object
is closed. Nothing here decodes: it only finds ends, minding strings and their escapes.
"""

import json

_SPACE = " \t\r\n"
_PRIMITIVE_END = ",}] \t\r\n;"


def skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _SPACE:
        pos += 1
    return pos


def value_end(text: str, pos: int, *, final: bool = False) -> int | None:
    """The index just past the JSON value starting at `pos` (None: not whole yet). A bare
    number or literal at the very end is whole only when `final` (it could still grow)."""
    if pos >= len(text):
        return None
    first = text[pos]
    if first == '"':
        return _string_end(text, pos)
    if first not in "{[":
        end = pos
        while end < len(text) and text[end] not in _PRIMITIVE_END:
            end += 1
        return end if end < len(text) or final else None
    depth, i, n = 0, pos, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end is None:
                return None
            i = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _string_end(text: str, pos: int) -> int | None:
    i, n = pos + 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def object_members(text: str, pos: int, *, final: bool = False):
    """The members of the object starting at `pos` as {key: (value_start, value_end | None)},
    as far as the text goes, and the index past the object (None: not closed yet)."""
    members: dict[str, tuple[int, int | None]] = {}
    if pos >= len(text) or text[pos] != "{":
        return members, None
    i = skip_space(text, pos + 1)
    while i < len(text):
        if text[i] == "}":
            return members, i + 1
        if text[i] == ",":
            i = skip_space(text, i + 1)
            continue
        if text[i] != '"':
            return members, None  # not JSON: the caller finds the call invalid
        key_end = _string_end(text, i)
        if key_end is None:
            return members, None
        key = loads(text[i:key_end])
        i = skip_space(text, key_end)
        if i >= len(text) or text[i] != ":":
            return members, None
        start = skip_space(text, i + 1)
        if start >= len(text):
            return members, None
        end = value_end(text, start, final=final)
        if isinstance(key, str):
            members[key] = (start, end)
        if end is None:
            return members, None
        i = skip_space(text, end)
    return members, None


def loads(text: str):
    """The JSON value of `text`, or None when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None
