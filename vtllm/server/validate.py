"""Request bodies -> (prompts as token ids, SamplingParams), each error naming its param."""

import msgspec

from vtllm.errors import ContextLengthExceeded, InvalidParameter
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.server.protocol import ChatCompletionRequest, CompletionRequest
from vtllm.server.tools import history_calls

MAX_PROMPTS = 64  # prompts in one /v1/completions list
MAX_N = 16
MAX_MESSAGES = 2048  # bounds the chat template's loop, whatever the characters
MAX_CHOICES = 64  # prompts x n: one HTTP request never fans out into more engine requests
MAX_STOP = 4  # stop strings, as the OpenAI API documents
MAX_STOP_CHARS = 256  # text within this many characters of the end is held back while streaming
MAX_TOP_LOGPROBS = 20
MAX_TEMPERATURE = 2.0
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


_UNBOUNDED = 1 << 62  # a prompt length no context reaches
_ANY = msgspec.json.Decoder()
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_INT_LIST_BYTES = b"0123456789-, \t\r\n"  # all a JSON list of integers is made of, but [ ]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _decoded(raw: msgspec.Raw, name: str):
    """A field protocol.py left undecoded, as Python values; an error names the field."""
    try:
        return _ANY.decode(raw)
    except msgspec.ValidationError as exc:  # a number out of range: "... - at `$[3]`"
        raise msgspec.ValidationError(str(exc).replace("at `$", f"at `$.{name}", 1)) from None


def _too_many_ids(raw: msgspec.Raw, max_len: int) -> int | None:
    """How many ids a flat list of integers holds when that is more than `max_len`, from its
    bytes alone: a 4 MiB body holds two million of them (None: fewer, or another shape)."""
    if len(raw) < 2 * max_len + 1:  # "[1,1,...,1]": two bytes an id at the least
        return None
    data = bytes(raw)  # valid JSON (msgspec checked it while skipping over it)
    if data.translate(None, _INT_LIST_BYTES) != b"[]":
        return None
    count = data.count(b",") + 1  # no strings or nested lists: each comma parts two ids
    return count if count > max_len else None


def _context_exceeded(max_len: int, count: int) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        f"This model's maximum context length is {max_len} tokens. However, a "
        f"prompt holds {count} tokens. Please reduce the prompt.",
        param="prompt",
    )


def completion_prompts(
    req: CompletionRequest,
    tokenizer,
    vocab: int,
    max_chars: int,
    max_len: int = _UNBOUNDED,
    *,
    truncate: bool = True,
):
    """Every prompt of a completion request as token ids (tokenizing text). A token-id prompt
    longer than `max_len` (the context) is refused from its bytes, before it is decoded,
    unless truncate_prompt_tokens keeps only its tail."""
    keep = prompt_truncation(req, max_len) if truncate else None
    if keep is not None:  # any length fits once cut: the body and character caps bound it
        out = completion_prompts(req, tokenizer, vocab, max_chars, _UNBOUNDED, truncate=False)
        return [p[-keep:] for p in out]
    count = _too_many_ids(req.prompt, max_len)
    if count is not None:
        raise _context_exceeded(max_len, count)
    prompt = _decoded(req.prompt, "prompt") if len(req.prompt) else None
    if prompt is None:
        raise InvalidParameter("prompt is required", param="prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and _is_int(prompt[0]):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise InvalidParameter("prompt must be a non-empty string or list", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise InvalidParameter(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    out, total = [], 0
    for p in prompts:
        if isinstance(p, str):
            if not p:
                raise InvalidParameter("prompt must not be empty", param="prompt")
            total += len(p)  # per request, not per prompt: 64 prompts are one request's work
            if total > max_chars:
                raise InvalidParameter(f"prompt longer than {max_chars} characters", param="prompt")
            check_fits(tokenizer, p, max_len)
            out.append(tokenizer.encode(p))
            if len(out[-1]) > max_len:  # refused now, not after tokenizing the other prompts
                raise _context_exceeded(max_len, len(out[-1]))
        elif isinstance(p, list) and p and _is_int(p[0]):
            if len(p) > max_len:
                raise _context_exceeded(max_len, len(p))
            if not all(_is_int(t) for t in p):
                raise InvalidParameter(
                    "each prompt is a string or a list of token ids", param="prompt"
                )
            if any(t < 0 or t >= vocab for t in p):
                raise InvalidParameter(f"token ids must be in [0, {vocab})", param="prompt")
            out.append(list(p))
        else:
            raise InvalidParameter("each prompt is a string or a list of token ids", param="prompt")
    return out


def prompt_truncation(req, max_len: int) -> int | None:
    """How many prompt tokens truncate_prompt_tokens keeps, the last ones (None: all, and a
    longer prompt is refused). -1 is the context, as vLLM takes it."""
    keep = req.truncate_prompt_tokens
    if keep is None:
        return None
    if keep == -1:
        return max_len
    if not 1 <= keep <= max_len:
        raise InvalidParameter(
            f"truncate_prompt_tokens must be -1 (the context) or in [1, {max_len}]",
            param="truncate_prompt_tokens",
        )
    return keep


def continues_final_message(req, messages: list[dict]) -> bool:
    """Whether the prompt ends inside the final message, which must be the assistant's;
    add_generation_prompt (true by default, as in vLLM) must then be turned off."""
    if not req.continue_final_message:
        return False
    if req.add_generation_prompt:
        raise InvalidParameter(
            "continue_final_message and add_generation_prompt cannot both be true "
            "(add_generation_prompt defaults to true)",
            param="continue_final_message",
        )
    if messages[-1]["role"] != "assistant":
        raise InvalidParameter(
            "continue_final_message needs the last message to be the assistant's",
            param="continue_final_message",
        )
    return True


def check_fits(tokenizer, text: str, max_len: int) -> None:
    """Refuse, before tokenizing, a text that holds more tokens than the context for sure."""
    at_least = tokenizer.min_tokens(text)
    if at_least > max_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_len} tokens. However, the prompt "
            f"holds at least {at_least} tokens. Please reduce the prompt.",
            param="prompt",
        )


def chat_messages(req: ChatCompletionRequest, max_chars: int) -> list[dict]:
    try:  # counted as undecoded items first: 100k messages are refused without building them
        items = _ITEMS.decode(req.messages) if len(req.messages) else None
    except msgspec.ValidationError:  # not a list
        items = None
    if not items:
        raise InvalidParameter("messages must be a non-empty list", param="messages")
    if len(items) > MAX_MESSAGES:
        raise InvalidParameter(f"at most {MAX_MESSAGES} messages", param="messages")
    messages = _decoded(req.messages, "messages")
    clean, total = [], 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidParameter("a message is an object", param=f"messages[{i}].role")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidParameter(
                f"role must be one of {sorted(ROLES)}", param=f"messages[{i}].role"
            )
        if message.get("function_call"):  # the deprecated form; null asks for nothing
            raise InvalidParameter(
                "function_call is not supported; use tool_calls",
                param=f"messages[{i}].function_call",
            )
        calls = message.get("tool_calls")
        if calls and role != "assistant":
            raise InvalidParameter(
                "only assistant turns call tools", param=f"messages[{i}].tool_calls"
            )
        content = message.get("content")
        text = "" if content is None and calls else _content_text(content, i)
        total += len(text)
        if total > max_chars:
            raise InvalidParameter(f"messages longer than {max_chars} characters", param="messages")
        turn = {"role": "system" if role == "developer" else role, "content": text}
        if calls:  # an empty list or null asks for nothing
            turn["tool_calls"] = history_calls(calls, i)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise InvalidParameter(
                    "a tool turn names its call (tool_call_id)", param=f"messages[{i}].tool_call_id"
                )
            turn["tool_call_id"] = call_id
        clean.append(turn)
    return clean


def _content_text(content, i: int) -> str:
    param = f"messages[{i}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidParameter("only text content parts are supported", param=param)
            if not isinstance(part.get("text"), str):
                raise InvalidParameter("a text part needs a string 'text'", param=param)
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidParameter("content must be a string or a list of text parts", param=param)


def sampling_params(req, *, chat: bool, max_new_tokens: int) -> SamplingParams:
    stop = req.stop
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidParameter("stop must be a string or a list of strings", param="stop")
    if len(stop) > MAX_STOP:
        raise InvalidParameter(f"at most {MAX_STOP} stop strings", param="stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise InvalidParameter(f"stop strings hold 1 to {MAX_STOP_CHARS} characters", param="stop")
    if req.stream_options is not None and not req.stream:
        raise InvalidParameter("stream_options needs stream=true", param="stream_options")
    bias = _logit_bias(req.logit_bias)
    max_tokens, name = req.max_tokens, "max_tokens"
    if chat and req.max_completion_tokens is not None:  # OpenAI's newer name for it
        name = "max_completion_tokens"
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            raise InvalidParameter("max_tokens and max_completion_tokens differ", param=name)
        max_tokens = req.max_completion_tokens
        if max_tokens < 1:
            raise InvalidParameter(f"{name} must be at least 1", param=name)
    if max_tokens is None and not chat:
        max_tokens = 16  # the OpenAI default for completions
    if not chat and req.echo and max_tokens == 0:  # vLLM's way to score a prompt
        max_tokens = 1  # runs the prompt; the shaper shows no output
    if max_tokens is not None and max_tokens > max_new_tokens:
        raise ContextLengthExceeded(
            f"{name} is {max_tokens}; this server generates at most {max_new_tokens}",
            param=name,
        )
    if not 1 <= req.n <= MAX_N:
        raise InvalidParameter(f"n must be in [1, {MAX_N}]", param="n")
    if req.temperature is not None and req.temperature > MAX_TEMPERATURE:
        raise InvalidParameter(
            f"temperature must be in [0, {MAX_TEMPERATURE}] (the OpenAI range)", param="temperature"
        )
    if req.n > 1 and req.temperature == 0:
        raise InvalidParameter("n > 1 needs temperature > 0 (greedy choices are equal)", param="n")
    if chat:
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidParameter("top_logprobs needs logprobs=true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidParameter(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs"
            )
    else:
        logprobs = req.logprobs
    defaults = SamplingParams()
    return SamplingParams(
        n=req.n,
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=bias,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop=stop,
        stop_token_ids=req.stop_token_ids or [],
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=_prompt_logprobs(req, chat),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        bad_words=req.bad_words or None,
        allowed_token_ids=req.allowed_token_ids,
    )


def _prompt_logprobs(req, chat: bool) -> int | None:
    """echo with logprobs returns the prompt tokens' logprobs too, as vLLM does."""
    if chat or not req.echo or req.logprobs is None:
        return req.prompt_logprobs
    return max(req.prompt_logprobs or 0, req.logprobs)


def check_fan_out(num_prompts: int, n: int) -> None:
    if num_prompts * n > MAX_CHOICES:
        raise InvalidParameter(
            f"prompts x n is {num_prompts * n}; at most {MAX_CHOICES} per request", param="n"
        )


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    """Keys must be token ids; the error names the first few bad keys (each cut short)."""
    if not raw:
        return None
    bias, bad = {}, []
    for key, value in raw.items():
        if key.isascii() and key.isdigit() and len(key) <= 10:
            bias[int(key)] = value
        else:
            bad.append(key[:16])
    if bad:
        shown = ", ".join(repr(k) for k in bad[:5])
        raise InvalidParameter(
            f"logit_bias keys must be token ids; bad keys: {shown}", param="logit_bias"
        )
    return bias
