"""Per-request sampling settings, shaped like vLLM's SamplingParams."""

import math

import msgspec

from vtllm.errors import InvalidParameter

MAX_LOGIT_BIAS = 300  # entries per request, as the OpenAI API caps it
MAX_STOP_TOKEN_IDS = 60  # leaves room in the sampler's 65-wide stop table for eos ids
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_BAD_WORDS = 256


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A constraint on the output, as vLLM's StructuredOutputsParams: exactly one of the kinds.
    The grammar engine (llguidance) compiles it when the request is added; an invalid schema,
    regex or grammar is a 400 naming `field`, the request field it came from."""

    json: dict | str | None = None  # a JSON schema (object or its text)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None  # exactly one of these strings
    grammar: str | None = None  # Lark (llguidance's dialect, %json{...} allowed) or GBNF
    field: str = "structured_outputs"  # the request field named in errors

    def __post_init__(self):
        kinds = [
            k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(kinds) != 1:
            raise InvalidParameter(
                f"{self.field} must set exactly one of json, json_object, regex, choice, "
                f"grammar (got {', '.join(kinds) or 'none'})",
                param=self.field,
            )
        if self.choice is not None and (
            not self.choice or any(not isinstance(c, str) for c in self.choice)
        ):
            raise InvalidParameter(
                f"{self.field}: choice must be non-empty strings", param=self.field
            )

    def key(self) -> str:
        """What identifies the compiled grammar (the cache key)."""
        return msgspec.json.encode(
            [self.json, self.json_object, self.regex, self.choice, self.grammar]
        ).decode()


class SamplingParams(msgspec.Struct, kw_only=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per sampled token (0: just the sampled one)
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = (
        None  # never generated: a word's last token is masked after its prefix
    )

    def __post_init__(self):
        _check_int(self.n, "n", 1, 128)
        _check_float(self.temperature, "temperature", 0.0, 100.0)
        _check_float(self.top_p, "top_p", 0.0, 1.0)
        if self.top_p <= 0.0:
            raise InvalidParameter("top_p must be in (0, 1]", param="top_p")
        _check_int(self.top_k, "top_k", -1, 1 << 30)
        if self.top_k == -1:
            self.top_k = 0
        _check_float(self.min_p, "min_p", 0.0, 1.0)
        if self.seed is not None:
            _check_int(self.seed, "seed", -(1 << 63), (1 << 64) - 1)
        _check_float(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        _check_float(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        _check_float(self.repetition_penalty, "repetition_penalty", 0.0, 10.0)
        if self.repetition_penalty <= 0.0:
            raise InvalidParameter("repetition_penalty must be > 0", param="repetition_penalty")
        if self.max_tokens is not None:
            _check_int(self.max_tokens, "max_tokens", 1, 1 << 31)
        _check_int(self.min_tokens, "min_tokens", 0, 1 << 31)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameter("min_tokens must not exceed max_tokens", param="min_tokens")
        if self.logit_bias:
            if len(self.logit_bias) > MAX_LOGIT_BIAS:
                raise InvalidParameter(
                    f"logit_bias holds at most {MAX_LOGIT_BIAS} entries", param="logit_bias"
                )
            for token_id, bias in self.logit_bias.items():
                _check_int(token_id, "logit_bias", 0, 1 << 31)
                _check_float(bias, "logit_bias", -100.0, 100.0)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidParameter(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidParameter("stop strings must be non-empty strings", param="stop")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidParameter(
                f"at most {MAX_STOP_TOKEN_IDS} stop token ids", param="stop_token_ids"
            )
        for token_id in self.stop_token_ids:
            _check_int(token_id, "stop_token_ids", 0, 1 << 31)
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int(self.prompt_logprobs, "prompt_logprobs", 0, MAX_LOGPROBS)
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise InvalidParameter(
                    "allowed_token_ids must name at least one token", param="allowed_token_ids"
                )
            for token_id in self.allowed_token_ids:
                _check_int(token_id, "allowed_token_ids", 0, 1 << 31)
        if self.bad_words is not None:
            if len(self.bad_words) > MAX_BAD_WORDS:
                raise InvalidParameter(f"at most {MAX_BAD_WORDS} bad_words", param="bad_words")
            if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
                raise InvalidParameter("bad_words must be non-empty strings", param="bad_words")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids named by the request must exist in the model's vocabulary."""
        for name, ids in (
            ("logit_bias", self.logit_bias or ()),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
        ):
            for token_id in ids:
                if token_id >= vocab_size:
                    raise InvalidParameter(
                        f"{name}: token id {token_id} is outside the vocabulary ({vocab_size})",
                        param=name,
                    )


def _check_int(value, name: str, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"{name} must be an integer", param=name)
    if not lo <= value <= hi:
        raise InvalidParameter(f"{name} must be in [{lo}, {hi}], got {value}", param=name)


def _check_float(value, name: str, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidParameter(f"{name} must be a number", param=name)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidParameter(f"{name} must be a finite number in [{lo}, {hi}]", param=name)
