"""One chat choice's text -> message parts: reasoning, content, tool calls; whole or streamed.

The reasoning parser splits first, the tool-call parser reads what is left. Both splits are
monotone in the text (tool_parsers.py), so a stream hands out, at each update, what the split
of the text so far adds to what was handed out: reasoning and content fragments, then for each
call its id and name once the name is whole, then its arguments as they grow. The parts a
stream hands out add up to the non-streamed answer of the same text.

A final text whose calls do not parse (cut by max_tokens, or not JSON) is content, as vLLM
answers it; a stream that already announced a call cannot take it back.
"""

import uuid
from dataclasses import dataclass, field

from vtllm.scheduler.output import STOP
from vtllm.server.protocol import (
    ChatDeltaOut,
    ChatMessageOut,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
)
from vtllm.server.reasoning import ReasoningParser
from vtllm.server.tool_parsers import Split

TOOL_CALLS = "tool_calls"  # the finish reason of an answer that calls tools


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class Parts:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list = field(default_factory=list)  # ToolCall (whole) or ToolCallDelta


@dataclass(slots=True)
class ChatOutput:
    reasoning: ReasoningParser | None = None
    tools: object | None = None  # a tool_parsers format; None: no parsing of calls
    parallel: bool = True
    text: str = ""
    # what the stream handed out so far
    sent_reasoning: str = ""
    sent_content: str = ""
    sent_arguments: list[str] = field(default_factory=list)  # one per announced call

    @property
    def plain(self) -> bool:
        return self.reasoning is None and self.tools is None

    def _split(self, text: str, final: bool) -> tuple[str | None, Split | None, str]:
        reasoning, content = (
            (None, text) if self.reasoning is None else self.reasoning.split(text, final)
        )
        if self.tools is None:
            return reasoning, None, content
        split = self.tools.split(content, final)
        if not self.parallel:
            del split.calls[1:]
        return reasoning, split, content

    def whole(self, text: str) -> Parts:
        """The parts of a finished choice's text."""
        reasoning, split, content = self._split(text, True)
        if split is None or not split.calls:
            return Parts(reasoning, _or_none(split.content if split else content, reasoning))
        if not split.valid():
            return Parts(reasoning, _or_none(content, reasoning))
        calls = [ToolCall(call_id(), FunctionCall(c.name, c.arguments)) for c in split.calls]
        return Parts(reasoning, split.content if split.content.strip() else None, calls)

    def feed(self, delta: str, finished: bool) -> Parts:
        """What the stream hands out for `delta` (the text the engine added)."""
        self.text += delta
        reasoning, split, content = self._split(self.text, finished)
        out = Parts()
        if reasoning is not None:
            out.reasoning = _grown(self.sent_reasoning, reasoning)
            self.sent_reasoning += out.reasoning
        if split is not None:
            if finished and split.calls and not split.valid() and not self.sent_arguments:
                split = Split(content)  # nothing announced yet: the whole text is content
            content = split.content
        out.content = _grown(self.sent_content, content)
        self.sent_content += out.content
        for index, call in enumerate(split.calls if split is not None else ()):
            if index == len(self.sent_arguments):
                if call.name is None:
                    break
                self.sent_arguments.append("")
                out.tool_calls.append(
                    ToolCallDelta(index, call_id(), "function", FunctionCallDelta(call.name, ""))
                )
            fragment = _grown(self.sent_arguments[index], call.arguments)
            if fragment:
                self.sent_arguments[index] += fragment
                out.tool_calls.append(
                    ToolCallDelta(index, function=FunctionCallDelta(None, fragment))
                )
        return out

    @property
    def called(self) -> bool:
        return bool(self.sent_arguments)


def finish_reason(reason: str | None, called: bool) -> str | None:
    """A natural stop after tool calls is reported as `tool_calls` (OpenAI's reason)."""
    return TOOL_CALLS if called and reason == STOP else reason


def _grown(sent: str, now: str) -> str:
    """What `now` adds to `sent` (nothing when it does not extend it: never taken back)."""
    return now[len(sent) :] if now.startswith(sent) else ""


def _or_none(content: str, reasoning: str | None) -> str | None:
    return None if reasoning is not None and not content else content


def whole_message(parts: Parts) -> ChatMessageOut:
    return ChatMessageOut(
        role="assistant",
        content=parts.content,
        reasoning_content=parts.reasoning,
        tool_calls=parts.tool_calls or None,
    )


def streamed_message(parts: Parts) -> ChatDeltaOut | None:
    """A delta of what `parts` adds (None: nothing)."""
    if not (parts.content or parts.reasoning or parts.tool_calls):
        return None
    return ChatDeltaOut(
        content=parts.content or None,
        reasoning_content=parts.reasoning or None,
        tool_calls=parts.tool_calls or None,
    )
