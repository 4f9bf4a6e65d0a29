"""OpenAI wire formats as msgspec Structs: strict types, unknown fields ignored.

Fields whose JSON shape varies (prompt, messages, stop) are typed loosely here and checked in
validate.py, where each error can name its exact param (messages[0].role).

A prompt and the messages arrive undecoded (msgspec.Raw, the field's bytes, checked as JSON):
decoding a 4 MiB body of two million token ids or 100k messages into objects holds the GIL
for tens of milliseconds, on the event loop. Skipping over them is several times cheaper,
and validate.py refuses such a body from its bytes (ids counted by their commas, messages as
undecoded items) in a preprocessing thread, before building anything.
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


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


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


class CompletionRequest(_SamplingFields, kw_only=True):
    # str | list[str] | list[int] | list[list[int]]; empty when absent
    prompt: Prompt = msgspec.field(default_factory=msgspec.Raw)
    logprobs: int | None = None
    echo: bool = False


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Messages = msgspec.field(default_factory=msgspec.Raw)  # list of {role, content}
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | msgspec.UnsetType = msgspec.UNSET
    messages: Any = msgspec.UNSET
    add_special_tokens: bool = True


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


# -- responses -------------------------------------------------------------------------------


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: CompletionLogprobs | None = None


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


class ChatMessageOut(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: ChatLogprobs | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatMessageOut
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


encoder = msgspec.json.Encoder()
completion_decoder = msgspec.json.Decoder(CompletionRequest)
chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)
