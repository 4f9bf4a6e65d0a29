"""Per-request token constraints: structured outputs (llguidance), allowed_token_ids, bad_words.

A constraint lives with its request on the host. The scheduler feeds it every token the host
learns (`accept`); before a step samples the request, the step loop asks it for the packed
bitmask of the tokens allowed next (`fill`: bit t of word t // 32 set = token t may be sampled),
which travels in the plan and is applied to the logits before the sampler on either device.

The grammar engine is llguidance (Rust, no torch; llama.cpp and vLLM use it): it compiles a
JSON schema, regex, choice list or Lark/GBNF grammar against the vocabulary once, and computes a
mask in tens of microseconds. A compiled matcher is kept per grammar (an LRU of pristine
matchers), and each request gets a copy of it, which is cheap.
"""

import json
from collections import OrderedDict

import numpy as np

from vtllm.errors import InvalidParameter
from vtllm.scheduler.sampling_params import SamplingParams, StructuredOutputs

MAX_CACHED_GRAMMARS = 256


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class TokenConstraint:
    """What one request may sample next: the AND of its grammar, its allowed ids and its bad
    words. Fed the request's output tokens in order, one `accept` per token."""

    def __init__(self, vocab_size: int, *, matcher=None, allowed=None, bad_words=(), eos=()):
        self.words = mask_words(vocab_size)
        self.matcher = matcher  # llguidance.LLMatcher, or None
        self.allowed = allowed  # int32 [words] static mask, or None
        self.bad_words = bad_words  # token id tuples
        self.eos = eos  # what a broken grammar still allows: ending the request
        self.output: list[int] = []  # only kept when bad words need the recent tokens
        self._scratch = np.empty(self.words, np.int32)

    def accept(self, token_id: int) -> None:
        if self.matcher is not None and not self.matcher.is_error():
            self.matcher.consume_token(token_id)
        if self.bad_words:
            self.output.append(token_id)

    def fill(self, row: np.ndarray) -> None:
        """The packed mask of the next token, into row (int32 [words])."""
        m = self.matcher
        if m is None:
            row.fill(-1)
        elif m.is_error():  # cannot happen while the mask is obeyed; end the request cleanly
            row.fill(0)
            _set(row, self.eos)
        else:
            m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self.allowed is not None:
            row &= self.allowed
        for word in self.bad_words:
            prefix = word[:-1]
            if not prefix or tuple(self.output[-len(prefix) :]) == prefix:
                _clear(row, word[-1])

    def next_mask(self) -> bytes:
        self.fill(self._scratch)
        return self._scratch.tobytes()


def _set(row: np.ndarray, ids) -> None:
    bits = row.view(np.uint32)
    for t in ids:
        if 0 <= t < 32 * row.size:
            bits[t >> 5] |= np.uint32(1 << (t & 31))


def _clear(row: np.ndarray, t: int) -> None:
    if 0 <= t < 32 * row.size:
        row.view(np.uint32)[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)


class Constraints:
    """Builds each request's TokenConstraint; owns the grammar engine's tokenizer (built on
    first use: a fraction of a second) and the compiled grammars."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer  # vtllm.models.tokenizer.Tokenizer
        self.vocab_size = vocab_size  # the logits' width (the model's, maybe padded)
        self._ll_tokenizer = None
        self._compiled: OrderedDict[str, object] = OrderedDict()

    def build(self, params: SamplingParams) -> TokenConstraint | None:
        """The request's constraint, or None when it has none. Raises InvalidParameter naming
        the field for a grammar that does not compile."""
        spec, allowed, bad = params.structured_outputs, params.allowed_token_ids, params.bad_words
        if spec is None and allowed is None and not bad:
            return None
        return TokenConstraint(
            self.vocab_size,
            matcher=None if spec is None else self._matcher(spec),
            allowed=None if allowed is None else self._allowed(allowed),
            bad_words=self._bad_words(bad) if bad else (),
            eos=self.tokenizer.eos_token_ids,
        )

    def _matcher(self, spec: StructuredOutputs):
        import llguidance

        key = spec.key()
        pristine = self._compiled.get(key)
        if pristine is None:
            try:
                grammar = _grammar(spec)
            except (ValueError, TypeError) as exc:
                raise InvalidParameter(f"{spec.field}: {exc}", param=spec.field) from None
            pristine = llguidance.LLMatcher(self._llg_tokenizer(), grammar)
            if pristine.is_error():
                error = pristine.get_error().strip().splitlines()
                raise InvalidParameter(
                    f"{spec.field}: the grammar does not compile: {' '.join(error)[:500]}",
                    param=spec.field,
                )
            self._compiled[key] = pristine
            if len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return pristine.deep_copy()

    def _llg_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance

            tok = self.tokenizer
            self._ll_tokenizer = llguidance.LLTokenizer(
                tok.backend.to_str(), n_vocab=self.vocab_size, eos_token=tok.eos_token_ids[0]
            )
        return self._ll_tokenizer

    def _allowed(self, ids: list[int]) -> np.ndarray:
        row = np.zeros(mask_words(self.vocab_size), np.int32)
        _set(row, ids)
        return row

    def _bad_words(self, words: list[str]) -> tuple[tuple[int, ...], ...]:
        """Each word as generated at the start of the output and after a space (vLLM's rule:
        both tokenizations are banned); a word's last token is masked once the tokens before
        it were just generated."""
        encode = self.tokenizer.encode
        seqs = set()
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = tuple(encode(text, add_special_tokens=False))
                if ids:
                    seqs.add(ids)
        return tuple(sorted(seqs))


def _grammar(spec: StructuredOutputs) -> str:
    """llguidance's grammar text for a StructuredOutputs (ValueError when malformed)."""
    from llguidance import grammar_from

    if spec.json is not None:
        schema = spec.json
        if isinstance(schema, dict):
            schema = json.dumps(schema)
        return grammar_from("json_schema", schema)
    if spec.json_object:
        return grammar_from("json_schema", '{"type": "object"}')
    if spec.regex is not None:
        return grammar_from("regex", spec.regex)
    if spec.choice is not None:
        return grammar_from("choice", json.dumps(spec.choice))
    return grammar_from("grammar", spec.grammar)
