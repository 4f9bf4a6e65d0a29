"""Tool-call formats: how a model writes calls, read back out of its text.

Each format splits a model's text, whole or as far as it has streamed, into content and
calls. A split is monotone: the content and each call's arguments of a longer text extend
those of its prefix, so a stream hands out the difference each time (chat_output.py), and
what it handed out in total is what the non-streamed answer holds. Text that could still turn
into a call's opening marker is held back until it is decided.

Each format also writes calls (an assistant turn of the history, for templates that do not
know tools), a system preamble (the same templates), and a Lark grammar (llguidance's
dialect) that admits only well-formed calls of the given tools (tool_choice required or a
named function).

Formats, as vLLM names them: hermes (Hermes, Qwen: <tool_call>{json}</tool_call>),
llama3_json (Llama 3.x: {"name": ..., "parameters": ...}, `;` between calls), mistral
([TOOL_CALLS][{"name": ..., "arguments": ...}, ...]).
"""

import json
from dataclasses import dataclass, field

from vtllm.server.partial_json import loads, object_members, skip_space
from vtllm.server.structured import WHITESPACE


@dataclass(slots=True)
class PartialCall:
    name: str | None  # known once its string is whole
    arguments: str  # the arguments' JSON text, as far as it goes
    done: bool  # the call's object is closed


@dataclass(slots=True)
class Split:
    content: str
    calls: list[PartialCall] = field(default_factory=list)

    def valid(self) -> bool:
        """Every call whole, named, with a JSON object as arguments (a final text only)."""
        return all(c.done and c.name and isinstance(loads(c.arguments), dict) for c in self.calls)


def held(text: str, marker: str) -> str:
    """`text` less its longest ending that `marker` starts with (it may still become one)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return text[:-k]
    return text


def _call(text: str, pos: int, final: bool, args_keys: tuple[str, ...]):
    """The call whose JSON object starts at `pos`, and the index past it (None: open)."""
    members, end = object_members(text, pos, final=final)
    name = None
    if "name" in members and members["name"][1] is not None:
        start, stop = members["name"]
        value = loads(text[start:stop])
        name = value if isinstance(value, str) else None
    arguments = ""
    for key in args_keys:
        if key in members:
            start, stop = members[key]
            arguments = text[start : len(text) if stop is None else stop]
            break
    else:
        if end is not None:
            arguments = "{}"  # a call of a function without parameters may leave them out
    return PartialCall(name, arguments, end is not None), end


def _function_schema(tool: dict, args_key: str) -> dict:
    fn = tool["function"]
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: fn["parameters"]},
        "required": ["name", args_key],
        "additionalProperties": False,
        "x-guidance": WHITESPACE,  # bounded: a small model cannot wander into blank lines
    }


def _lark(tools: list[dict], args_key: str, start: str) -> str:
    names = [f"fn_{i}" for i in range(len(tools))]
    lines = [start, "fn: " + " | ".join(names)]
    for rule, tool in zip(names, tools, strict=True):
        lines.append(f"{rule}: %json {json.dumps(_function_schema(tool, args_key))}")
    return "\n".join(lines) + "\n"


def _signatures(tools: list[dict]) -> str:
    return "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)


class Hermes:
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    ARGS = ("arguments", "parameters")

    def split(self, text: str, final: bool) -> Split:
        first = text.find(self.OPEN)
        if first < 0:
            return Split(text if final else held(text, self.OPEN))
        out = Split(text[:first])
        pos = first
        while True:
            close = text.find(self.CLOSE, pos)
            inner = text[: len(text) if close < 0 else close]
            start = skip_space(inner, pos + len(self.OPEN))
            call, _ = _call(inner, start, final or close >= 0, self.ARGS)
            out.calls.append(call)
            if close < 0:
                return out
            pos = close + len(self.CLOSE)
            following = text.find(self.OPEN, pos)
            if following < 0:
                tail = text[pos:] if final else held(text[pos:], self.OPEN)
                if tail.strip():  # words after the calls are content too
                    out.content += tail
                return out
            pos = following

    def write(self, calls: list[tuple[str, dict]]) -> str:
        return "\n".join(
            f"{self.OPEN}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n"
            f"{self.CLOSE}"
            for n, a in calls
        )

    def preamble(self, tools: list[dict]) -> str:
        return (
            "You can call functions to answer. Their signatures, one JSON object a line:\n"
            f"{_signatures(tools)}\n"
            "To call one, write a block like this for each call, and nothing else:\n"
            f'{self.OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}'
            f"\n{self.CLOSE}"
        )

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        call = f'call: "{self.OPEN}\\n" fn "\\n{self.CLOSE}"'
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return _lark(tools, "arguments", f"{start}\n{call}")


class Llama3Json:
    name = "llama3_json"
    TAG = "<|python_tag|>"
    ARGS = ("parameters", "arguments")

    def split(self, text: str, final: bool) -> Split:
        pos = skip_space(text, 0)
        if text.startswith(self.TAG, pos):
            pos = skip_space(text, pos + len(self.TAG))
            if pos >= len(text):
                return Split("")  # the tag alone: a call's object is to follow
        elif not final and self.TAG.startswith(text[pos:]):
            return Split("")  # blank so far, or the tag's beginning: undecided
        if pos >= len(text) or text[pos] != "{":
            return Split(text)  # a call's text starts with its object: this is an answer
        out = Split("")
        while pos < len(text) and text[pos] == "{":
            call, end = _call(text, pos, final, self.ARGS)
            out.calls.append(call)
            if end is None:
                break
            pos = skip_space(text, end)
            if text.startswith(";", pos):
                pos = skip_space(text, pos + 1)
        return out

    def write(self, calls: list[tuple[str, dict]]) -> str:
        return "; ".join(
            json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls
        )

    def preamble(self, tools: list[dict]) -> str:
        return (
            "You can call functions to answer. Their signatures, one JSON object a line:\n"
            f"{_signatures(tools)}\n"
            "To call one, answer with only a JSON object like "
            '{"name": "<function name>", "parameters": {<arguments as JSON>}}; '
            "separate several calls with '; '."
        )

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        return _lark(tools, "parameters", 'start: fn ("; " fn)*' if parallel else "start: fn")


class Mistral:
    name = "mistral"
    TAG = "[TOOL_CALLS]"
    ARGS = ("arguments", "parameters")

    def split(self, text: str, final: bool) -> Split:
        first = text.find(self.TAG)
        if first < 0:
            return Split(text if final else held(text, self.TAG))
        out = Split(text[:first])
        pos = skip_space(text, first + len(self.TAG))
        if not text.startswith("[", pos):
            if pos < len(text) or final:
                out.calls.append(PartialCall(None, "", False))  # not a list: invalid
            return out
        pos = skip_space(text, pos + 1)
        while pos < len(text) and text[pos] == "{":
            call, end = _call(text, pos, final, self.ARGS)
            out.calls.append(call)
            if end is None:
                break
            pos = skip_space(text, end)
            if text.startswith(",", pos):
                pos = skip_space(text, pos + 1)
        return out

    def write(self, calls: list[tuple[str, dict]]) -> str:
        body = [{"name": n, "arguments": a} for n, a in calls]
        return self.TAG + json.dumps(body, ensure_ascii=False)

    def preamble(self, tools: list[dict]) -> str:
        return (
            "You can call functions to answer. Their signatures, one JSON object a line:\n"
            f"{_signatures(tools)}\n"
            f"To call them, answer with only {self.TAG} and a JSON list of calls, like "
            f'{self.TAG}[{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}]'
        )

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        more = ' (", " fn)*' if parallel else ""
        return _lark(tools, "arguments", f'start: "{self.TAG}[" fn{more} "]"')


PARSERS = {p.name: p for p in (Hermes(), Llama3Json(), Mistral())}


def detect(template: str | None) -> str:
    """The format a chat template writes calls in; hermes when it shows none (vtllm then
    describes the tools in a system preamble of that format)."""
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or ("ipython" in text and '"parameters"' in text):
        return "llama3_json"
    return "hermes"
