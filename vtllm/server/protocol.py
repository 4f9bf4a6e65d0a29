"""OpenAI wire formats as msgspec Structs: strict types; every field a client may send is
declared, and the ones no API defines are named (RequestDecoder).

Fields whose JSON shape varies (prompt, messages, stop) are typed loosely here and checked in
validate.py, where each error can name its exact param (messages[0].role).

A prompt and the messages arrive undecoded (msgspec.Raw, the field's bytes, checked as JSON):
decoding a 4 MiB body of two million token ids or 100k messages into objects holds the GIL
for tens of milliseconds, on the event loop. Skipping over them is several times cheaper,
and validate.py refuses such a body from its bytes (ids counted by their commas, messages as
undecoded items) in a preprocessing thread, before building anything.

Fields that OpenAI or vLLM define but vtllm does not honour yet are declared too, as
`Unsupported` (undecoded: a large `tools` list costs a skip, not a decode); fields.py refuses
any value of theirs that asks for something.
"""

from typing import Annotated, Any

import msgspec

# Loosely typed fields, described for /openapi.json (validate.py enforces the shapes).
_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_PROMPT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        _TOKENS,
        {"type": "array", "items": _TOKENS},
    ]
}
_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_MESSAGES = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant"]},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _PART}]},
        },
        "required": ["role", "content"],
    },
}
_STOP = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
Prompt = Annotated[msgspec.Raw, msgspec.Meta(extra_json_schema=_PROMPT)]
Messages = Annotated[msgspec.Raw, msgspec.Meta(extra_json_schema=_MESSAGES)]
Stop = Annotated[Any, msgspec.Meta(extra_json_schema=_STOP)]
Unsupported = Annotated[
    msgspec.Raw, msgspec.Meta(description="not supported yet: only the default value is accepted")
]
# Honoured fields whose shape varies: decoded and checked where they are used
# (structured.py, tools.py), where each error can name its exact param.
Checked = Annotated[msgspec.Raw, msgspec.Meta(description="checked where it is used")]
ABSENT = msgspec.field(default_factory=msgspec.Raw)  # an Unsupported field not sent: empty


class StreamOptions(msgspec.Struct):
    include_usage: bool = False  # a last chunk with the request's usage
    # vLLM's: every chunk carries its choice's usage so far. Honoured without include_usage
    # too (vLLM then sends none): a field that asks for something gets it.
    continuous_usage_stats: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: Stop = None  # str | list[str]
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0  # vLLM's: lower is scheduled first
    prompt_logprobs: int | None = None  # vLLM's
    best_of: int | None = None  # accepted when equal to n
    # Structured outputs (OpenAI's response_format, vLLM's structured_outputs and guided_*)
    response_format: Checked = ABSENT
    structured_outputs: Checked = ABSENT
    guided_json: Checked = ABSENT
    guided_regex: Checked = ABSENT
    guided_choice: Checked = ABSENT
    guided_grammar: Checked = ABSENT
    guided_decoding_backend: Checked = ABSENT
    guided_whitespace_pattern: Checked = ABSENT
    # vLLM's other sampling and output extras
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens
    bad_words: list[str] | None = None  # never generated (engine/structured)
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    logits_processors: Unsupported = ABSENT
    use_beam_search: Unsupported = ABSENT
    length_penalty: Unsupported = ABSENT
    spaces_between_special_tokens: Unsupported = ABSENT
    return_tokens_as_token_ids: Unsupported = ABSENT
    return_token_ids: Unsupported = ABSENT
    cache_salt: Unsupported = ABSENT
    kv_transfer_params: Unsupported = ABSENT
    vllm_xargs: Unsupported = ABSENT
    request_id: Unsupported = ABSENT


class CompletionRequest(_SamplingFields, kw_only=True):
    # str | list[str] | list[int] | list[list[int]]; empty when absent
    prompt: Prompt = msgspec.field(default_factory=msgspec.Raw)
    logprobs: int | None = None
    echo: bool = False
    suffix: Unsupported = ABSENT


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Messages = msgspec.field(default_factory=msgspec.Raw)  # list of {role, content}
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # tracking and cache-routing hints: they ask nothing of the output
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call (tools.py)
    tools: Checked = ABSENT
    tool_choice: Checked = ABSENT
    functions: Unsupported = ABSENT
    function_call: Unsupported = ABSENT
    chat_template: Unsupported = ABSENT
    chat_template_kwargs: Checked = ABSENT
    continue_final_message: bool = False  # vLLM's: the prompt ends inside the last message
    documents: Unsupported = ABSENT
    mm_processor_kwargs: Unsupported = ABSENT
    echo: Unsupported = ABSENT
    modalities: Unsupported = ABSENT
    audio: Unsupported = ABSENT
    prediction: Unsupported = ABSENT
    reasoning_effort: Unsupported = ABSENT
    verbosity: Unsupported = ABSENT
    web_search_options: Unsupported = ABSENT
    store: Unsupported = ABSENT
    metadata: Unsupported = ABSENT
    service_tier: Unsupported = ABSENT


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | msgspec.UnsetType = msgspec.UNSET
    # vLLM's chat form: the ids a chat request with these messages is prompted with
    messages: Messages = msgspec.field(default_factory=msgspec.Raw)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = True


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


# -- responses -------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(msgspec.Struct):
    logprob: float
    rank: int
    decoded_token: str


# vLLM's shape: one entry per prompt token, None for the first; token id (a string) -> logprob
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobs | msgspec.UnsetType = msgspec.UNSET  # absent unless asked


class CompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: Usage | None = None


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # a JSON object's text


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class FunctionCallDelta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """A streamed call: its id, type and name come first, its arguments in fragments after."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


class ChatMessageOut(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None  # vLLM's, with --reasoning-parser
    tool_calls: list[ToolCall] | None = None


class ChatDeltaOut(ChatMessageOut, omit_defaults=True):
    tool_calls: list[ToolCallDelta] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: ChatLogprobs | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDeltaOut
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    object: str = "chat.completion"
    usage: Usage | None = None
    prompt_logprobs: PromptLogprobs | msgspec.UnsetType = msgspec.UNSET  # absent unless asked


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


class RequestDecoder:
    """Decodes a request body, and names the fields in it that no API defines.

    The body is decoded first by a copy of the Struct that forbids unknown fields: a body
    without one (nearly all) costs the one decode it always did. Only a body that holds one
    is decoded again, leniently, and its keys listed (a skip over the values): up to three
    passes over the body, paid by that request alone.
    """

    def __init__(self, struct: type):
        annotations = {}
        if "stream_options" in struct.__struct_fields__:
            annotations["stream_options"] = _StrictStreamOptions | None
        strict = type(
            "Strict" + struct.__name__,
            (struct,),
            {"__annotations__": annotations, **dict.fromkeys(annotations)},
            forbid_unknown_fields=True,
            kw_only=True,
        )
        self._strict = msgspec.json.Decoder(strict)
        self._lenient = msgspec.json.Decoder(struct)
        self._fields = frozenset(struct.__struct_fields__)

    def decode(self, body: bytes) -> tuple[Any, list[str]]:
        try:
            return self._strict.decode(body), []
        except msgspec.ValidationError as exc:
            if not str(exc).startswith("Object contains unknown field"):
                raise
        return self._lenient.decode(body), self.unknown_fields(body)

    def unknown_fields(self, body: bytes) -> list[str]:
        """The body's undeclared keys in order, stream_options' as `stream_options.key`."""
        names = []
        for key, value in _KEYS.decode(body).items():
            if key not in self._fields:
                names.append(key)
            elif key == "stream_options" and memoryview(value)[:1] == b"{":
                names += [f"{key}.{k}" for k in _KEYS.decode(value) if k not in _STREAM]
        return names


class _StrictStreamOptions(StreamOptions, forbid_unknown_fields=True):
    pass


_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_STREAM = frozenset(StreamOptions.__struct_fields__)
encoder = msgspec.json.Encoder()
completion_decoder = RequestDecoder(CompletionRequest)
chat_decoder = RequestDecoder(ChatCompletionRequest)
tokenize_decoder = RequestDecoder(TokenizeRequest)
detokenize_decoder = RequestDecoder(DetokenizeRequest)
