"""Reasoning parsers: a model's `<think>...</think>` text goes to `reasoning_content`, the
rest to `content`, in messages and in stream deltas (as vLLM's --reasoning-parser).

- qwen3: reasoning only where the model opened it, `<think>` first in its output; output
  without it (thinking switched off in the template: `enable_thinking: false`) is content.
- deepseek_r1: the output starts inside the reasoning, whether the model writes `<think>` or
  the template already opened it; until `</think>` comes, everything is reasoning.
Either parser also starts inside when the rendered prompt ends in an open `<think>` (templates
that open it for the model, as Qwen3's thinking variants do).

A split is monotone like a tool-call split (tool_parsers.py): the text a marker may still
complete is held back until it is decided.
"""

from dataclasses import dataclass

from vtllm.server.tool_parsers import held

START, END = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek_r1")


@dataclass(slots=True, frozen=True)
class ReasoningParser:
    name: str
    opened_by_prompt: bool = False  # the prompt ends inside <think>

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(reasoning, content) of the output so far; reasoning None when there is none."""
        lead = len(text) - len(text.lstrip())
        rest = text[lead:]
        if rest.startswith(START):
            body = rest[len(START) :]
        elif not final and START.startswith(rest):
            return None, ""  # blank so far, or the marker's beginning: undecided
        elif self.name == "deepseek_r1" or self.opened_by_prompt:
            body = text
        else:
            return None, text
        end = body.find(END)
        if end < 0:
            return (body if final else held(body, END)), ""
        # the newlines a template puts after the marker are not content
        return body[:end], body[end + len(END) :].lstrip("\n")

    @staticmethod
    def for_prompt(name: str, prompt_text: str) -> "ReasoningParser":
        return ReasoningParser(name, prompt_text.rstrip().endswith(START))
