"""What a chat request asks past its messages: tools, template variables, an output
constraint, and how its answer is read back (reasoning and tool-call parsers).

Built in the request's preprocessing step (tools' schemas are checked there, off the event
loop when the body is large); routes.py renders the template with it, then lets it constrain
the sampling parameters, and the chat shaper reads each choice through `output()`.
"""

from dataclasses import dataclass

from vtllm.errors import InvalidParameter
from vtllm.models.chat_template import template_variables
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.server.chat_output import ChatOutput
from vtllm.server.reasoning import ReasoningParser
from vtllm.server.structured import structured_outputs
from vtllm.server.tool_parsers import PARSERS, detect
from vtllm.server.tools import ToolRequest, for_template, template_kwargs, tool_request

# Formats whose markers are special tokens: the text must keep them to be parsed (vLLM too).
_SPECIAL_MARKERS = frozenset({"mistral", "llama3_json"})


def tool_parser(config, template: str | None):
    name = config.tool_call_parser
    return PARSERS[detect(template) if name == "auto" else name]


@dataclass(slots=True)
class ChatSetup:
    messages: list[dict]  # as the template gets them
    template_tools: list[dict] | None
    extra: dict  # chat_template_kwargs
    tools: ToolRequest | None
    parser: object  # the tool-call format
    reasoning_name: str | None
    reasoning: ReasoningParser | None = None  # set once the prompt is rendered

    @classmethod
    def of(cls, req, messages: list[dict], config, template: str | None) -> "ChatSetup":
        tools = tool_request(req)
        parser = tool_parser(config, template)
        knows_tools = "tools" in template_variables(template)
        shown, template_tools = for_template(messages, tools, parser, knows_tools)
        return cls(
            shown, template_tools, template_kwargs(req), tools, parser, config.reasoning_parser
        )

    def rendered(self, prompt_text: str) -> None:
        if self.reasoning_name is not None:
            self.reasoning = ReasoningParser.for_prompt(self.reasoning_name, prompt_text)

    def constrain(self, req, params: SamplingParams) -> None:
        """The request's output constraint (response_format, guided_*, or the tool grammar of
        tool_choice required or named) into `params`."""
        constraint = structured_outputs(req)
        grammar = None if self.tools is None else self.tools.grammar(self.parser)
        if grammar is not None:
            if constraint is not None:
                raise InvalidParameter(
                    f"tool_choice {self.tools.choice} constrains the output already; "
                    f"{constraint.field} cannot as well",
                    param=constraint.field,
                )
            constraint = grammar
        params.structured_outputs = constraint
        if self.parses_tools and self.parser.name in _SPECIAL_MARKERS:
            params.skip_special_tokens = False

    @property
    def parses_tools(self) -> bool:
        return self.tools is not None and self.tools.parses

    def output(self) -> ChatOutput:
        parallel = self.tools is None or self.tools.parallel
        return ChatOutput(self.reasoning, self.parser if self.parses_tools else None, parallel)
