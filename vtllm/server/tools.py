"""Tool calling, the request side: `tools`, `tool_choice`, `parallel_tool_calls`, the tool
turns of the history, and how all of them reach the chat template.

- A template that uses the `tools` variable (Qwen, Llama 3.1, Mistral, ...) gets the tools, the
  assistant turns' `tool_calls` (arguments as objects, as HF's apply_chat_template passes
  them) and the `tool` turns as they are.
- A template that does not (the default model's, SmolLM2's) would drop them: vtllm then
  describes the tools in a system preamble in the tool-call format's words, writes earlier
  calls into the assistant turns' text in that format, and hands tool results back as user
  turns inside <tool_response> tags.
- `tool_choice` required or a named function constrains the output with a grammar of
  well-formed calls in that format (tool_parsers.py), so the answer always parses.
"""

from dataclasses import dataclass

from llguidance import LLMatcher

from vtllm.errors import InvalidParameter
from vtllm.scheduler.sampling_params import StructuredOutputs
from vtllm.server.partial_json import loads
from vtllm.server.structured import NAME, decoded

MAX_TOOLS = 128  # as OpenAI caps them
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
# Template variables a request's chat_template_kwargs may not set: vtllm sets them.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


@dataclass(slots=True, frozen=True)
class ToolRequest:
    tools: list[dict]  # validated, in OpenAI's shape, `parameters` always set
    choice: str  # none | auto | required | named
    named: str | None = None  # the function of a named choice
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the answer is read for calls (with none, the tools are only shown)."""
        return self.choice != "none"

    def grammar(self, parser) -> StructuredOutputs | None:
        """The constraint of required and named choices: only well-formed calls."""
        if self.choice == "required":
            return StructuredOutputs(grammar=parser.grammar(self.tools, self.parallel), field=_C)
        if self.choice == "named":
            named = [t for t in self.tools if t["function"]["name"] == self.named]
            return StructuredOutputs(grammar=parser.grammar(named, False), field=_C)
        return None


_C = "tool_choice"


def tool_request(req) -> ToolRequest | None:
    """The request's tools and choice, checked (None: no tools and no choice)."""
    tools = decoded(req.tools, "tools")
    choice = decoded(req.tool_choice, _C)
    if tools is not None and not isinstance(tools, list):
        raise InvalidParameter("tools must be a list", param="tools")
    if not tools:
        if choice not in (None, "none"):
            raise InvalidParameter("tool_choice needs tools", param=_C)
        return None
    if len(tools) > MAX_TOOLS:
        raise InvalidParameter(f"at most {MAX_TOOLS} tools", param="tools")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidParameter(f"two tools are named {name}", param=f"tools[{i}].function.name")
    parallel = req.parallel_tool_calls is not False
    if choice is None:
        return ToolRequest(checked, "auto", parallel=parallel)
    if choice in ("none", "auto", "required"):
        return ToolRequest(checked, choice, parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidParameter("tool_choice.function.name is required", param=f"{_C}.function")
        if name not in names:
            raise InvalidParameter(
                "tool_choice names no tool of tools", param=f"{_C}.function.name"
            )
        return ToolRequest(checked, "named", name, parallel=False)
    raise InvalidParameter(
        "tool_choice must be none, auto, required or {type: function, function: {name}}",
        param=_C,
    )


def _tool(tool, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidParameter("a tool is {type: function, function: {...}}", param=param)
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise InvalidParameter("a tool's function is an object", param=f"{param}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidParameter(
            "a function name is 1 to 64 letters, digits, '_' or '-'", param=f"{param}.function.name"
        )
    if not isinstance(fn.get("description", ""), str | None):
        raise InvalidParameter(
            "a function's description is a string", param=f"{param}.function.description"
        )
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    # The grammar engine's check of the schema: what it cannot compile is refused now, not
    # when tool_choice required first needs it.
    error = None
    if isinstance(parameters, dict):
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(parameters))
    if not isinstance(parameters, dict) or error:
        raise InvalidParameter(
            "a function's parameters must be a valid JSON schema object",
            param=f"{param}.function.parameters",
        )
    out = {"name": name, "parameters": parameters}
    if fn.get("description"):
        out["description"] = fn["description"]
    return {"type": "function", "function": out}


def template_kwargs(req) -> dict:
    """chat_template_kwargs: extra variables for the template (enable_thinking, ...)."""
    name = "chat_template_kwargs"
    kwargs = decoded(req.chat_template_kwargs, name)
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidParameter(f"{name} must be an object", param=name)
    for key in kwargs:
        if not key.isidentifier() or key in RESERVED_TEMPLATE_VARIABLES:
            shown = key[:32] if key.isprintable() else "?"
            raise InvalidParameter(f"{name}: {shown!r} is not a variable it may set", param=name)
    return kwargs


def for_template(messages: list[dict], tools: ToolRequest | None, parser, knows_tools: bool):
    """(messages, tools) as the chat template gets them (see the module's docstring)."""
    if knows_tools:
        return messages, None if tools is None else tools.tools
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append(
                {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
            )
        elif m.get("tool_calls"):
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            text = "\n".join(t for t in (m["content"], parser.write(calls)) if t)
            out.append({"role": "assistant", "content": text})
        else:
            out.append(m)
    if tools is not None:
        preamble = parser.preamble(tools.tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out, None


def history_calls(calls, i: int) -> list[dict]:
    """An assistant turn's tool_calls, checked, arguments decoded (templates dump them)."""
    param = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise InvalidParameter(f"tool_calls must be a list of at most {MAX_TOOLS}", param=param)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidParameter(
                "a tool call is {id, type: function, function: {name, arguments}}",
                param=f"{param}[{j}]",
            )
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            arguments = loads(arguments)
        if not isinstance(arguments, dict):
            raise InvalidParameter(
                "a call's arguments are a JSON object's text", param=f"{param}[{j}].function"
            )
        call_id = call.get("id")
        out.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{j}",
                "type": "function",
                "function": {"name": fn["name"], "arguments": arguments},
            }
        )
    return out
