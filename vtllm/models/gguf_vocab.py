"""`tokenizers` backends built from a GGUF file's vocabulary, one per llama.cpp tokenizer model.

`tokenizer.ggml.model` names the algorithm; each builder reproduces what llama.cpp does with
that vocabulary (which for SPM is also what the model's original legacy tokenizer.json does):

- "gpt2": byte-level BPE with merges, split by the `tokenizer.ggml.pre` regex.
- "llama": SentencePiece BPE. Adjacent pieces merge best-score first, so the merges are every
  split of a piece into two pieces, ranked by the merged piece's score. Spaces become "▁", one
  is prepended to every run of text (at the start and after each special token) unless
  `tokenizer.ggml.add_space_prefix` is false, characters outside the vocabulary fall back to
  their `<0xXX>` byte tokens.
- "t5": SentencePiece unigram (Viterbi over the scores) after the model's precompiled
  normalization and, unless disabled, sentencepiece's whitespace clean-up.
- "bert": WordPiece. llama.cpp's converter stores word-initial pieces with a "▁" and
  continuations bare; they are turned back into BERT's "##" form.

Control and unknown tokens are special added tokens and user-defined ones plain added tokens:
their text in a prompt is that token, as with HF's tokenizers and llama.cpp's server.
"""

from dataclasses import dataclass

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from vtllm.errors import ModelLoadError, UnsupportedModel

# llama.cpp's token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Pre-tokenizer split patterns that GGUF names by `tokenizer.ggml.pre` (the same regexes the
# original tokenizer.json files carry).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(slots=True)
class Vocab:
    backend: Backend
    bos_token_id: int | None
    add_bos: bool  # the BOS id leads an encoded prompt
    append_ids: tuple[int, ...]  # ids that close an encoded prompt (BERT's [SEP], T5's EOS)
    # True when the normalizer only ever replaces a space by "▁" or prepends one, so that
    # decoding a token alone still tells how much text it can cover
    normalizer_keeps_length: bool


def build(meta, path) -> Vocab:
    """`meta(key, default)` reads one GGUF metadata field."""
    model = meta("tokenizer.ggml.model", None)
    builders = {"gpt2": _gpt2, "llama": _spm, "t5": _unigram, "bert": _wordpiece}
    if model not in builders:
        raise UnsupportedModel(
            f"{path}: GGUF tokenizer model {model!r} is not supported "
            f"(supported: {', '.join(builders)}); use the model's HF directory with tokenizer.json"
        )
    tokens = meta("tokenizer.ggml.tokens", None)
    if not tokens:
        raise ModelLoadError(f"{path}: GGUF metadata has no tokenizer.ggml.tokens")
    types = list(meta("tokenizer.ggml.token_type", None) or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ModelLoadError(f"{path}: tokenizer.ggml.token_type does not match the token list")
    return builders[model](meta, path, tokens, types)


def _add_token_types(backend: Backend, tokens, types) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain ones, in
    id order."""
    added = []
    for token, kind in zip(tokens, types, strict=True):
        if kind in (CONTROL, UNKNOWN):
            added.append(AddedToken(token, special=True, normalized=False))
        elif kind == USER_DEFINED:
            added.append(AddedToken(token, special=False, normalized=False))
    if added:
        backend.add_tokens(added)


def _vocab(backend, meta, *, add_bos: bool, add_eos: bool, keeps_length: bool) -> Vocab:
    """BOS and EOS as the metadata says, its add_bos / add_eos flags over the model's defaults."""
    bos, eos = meta("tokenizer.ggml.bos_token_id", None), meta("tokenizer.ggml.eos_token_id", None)
    add_eos = bool(meta("tokenizer.ggml.add_eos_token", add_eos)) and eos is not None
    return Vocab(
        backend,
        None if bos is None else int(bos),
        add_bos=bool(meta("tokenizer.ggml.add_bos_token", add_bos)),
        append_ids=(int(eos),) if add_eos else (),
        normalizer_keeps_length=keeps_length,
    )


def _token_index(tokens) -> dict[str, int]:
    """Text -> id; where a text repeats, the last id wins (as in llama.cpp's lookup)."""
    return {t: i for i, t in enumerate(tokens)}


def _gpt2(meta, path, tokens, types) -> Vocab:
    pre = meta("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False, True)]
        )
    elif pre in ("default", "gpt-2"):
        pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in ("llama-bpe", "llama3"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre == "qwen2":
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        raise UnsupportedModel(f"{path}: GGUF pre-tokenizer {pre!r} is not supported")
    vocab = _token_index(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta("tokenizer.ggml.merges", [])]
    # A merge whose result is no token: llama.cpp splits that result back into its bytes (the
    # same tokens as not merging), `tokenizers` refuses the whole vocabulary. Leave it out.
    merges = [m for m in merges if len(m) == 2 and m[0] + m[1] in vocab]
    backend = Backend(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    # llama.cpp's converter stores user-defined tokens as raw text (not byte-level)
    _add_token_types(backend, tokens, types)
    return _vocab(backend, meta, add_bos=False, add_eos=False, keeps_length=True)


def spm_merges(tokens, scores) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, the best-scored result first (ties: lower id)."""
    vocab = _token_index(tokens)
    ranked = []
    for i, piece in enumerate(tokens):
        if vocab[piece] != i:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, vocab[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _space_decoder(prefix: bool):
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def _unk_id(types, meta) -> int | None:
    unk = meta("tokenizer.ggml.unknown_token_id", None)
    if unk is None:
        unk = next((i for i, kind in enumerate(types) if kind == UNKNOWN), None)
    return None if unk is None or not 0 <= int(unk) < len(types) else int(unk)


def _unk_token(tokens, types, meta) -> str | None:
    unk = _unk_id(types, meta)
    return None if unk is None else tokens[unk]


def _spm(meta, path, tokens, types) -> Vocab:
    scores = meta("tokenizer.ggml.scores", None)
    if scores is None or len(scores) != len(tokens):
        raise ModelLoadError(f"{path}: an SPM (llama) vocabulary needs tokenizer.ggml.scores")
    bpe = models.BPE(
        vocab=_token_index(tokens),
        merges=spm_merges(tokens, scores),
        unk_token=_unk_token(tokens, types, meta),
        fuse_unk=True,
        byte_fallback=BYTE in types,
    )
    backend = Backend(bpe)
    prefix = bool(meta("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(SPACE)] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    backend.decoder = _space_decoder(prefix)
    _add_token_types(backend, tokens, types)
    return _vocab(backend, meta, add_bos=True, add_eos=False, keeps_length=True)


def _unigram(meta, path, tokens, types) -> Vocab:
    scores = meta("tokenizer.ggml.scores", None)
    if scores is None or len(scores) != len(tokens):
        raise ModelLoadError(f"{path}: a unigram (t5) vocabulary needs tokenizer.ggml.scores")
    unigram = models.Unigram(
        [(t, float(s)) for t, s in zip(tokens, scores, strict=True)],
        unk_id=_unk_id(types, meta),
        byte_fallback=BYTE in types,
    )
    backend = Backend(unigram)
    steps = []
    charsmap = meta("tokenizer.ggml.precompiled_charsmap", None)
    if charsmap:
        steps.append(normalizers.Precompiled(bytes(b & 0xFF for b in charsmap)))
    if meta("tokenizer.ggml.remove_extra_whitespaces", True):
        # sentencepiece trims and collapses spaces only: newlines and tabs stay
        trim = normalizers.Replace(Regex(r"\A +| +\z"), "")
        steps += [trim, normalizers.Replace(Regex(" {2,}"), " ")]
    prefix = bool(meta("tokenizer.ggml.add_space_prefix", True))
    if prefix:
        steps.append(normalizers.Prepend(SPACE))
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    backend.decoder = _space_decoder(prefix)
    _add_token_types(backend, tokens, types)
    return _vocab(backend, meta, add_bos=False, add_eos=True, keeps_length=False)


def _wordpiece(meta, path, tokens, types) -> Vocab:
    def bert_form(token: str, kind: int) -> str:
        if kind in (CONTROL, UNKNOWN, USER_DEFINED, UNUSED) or (
            token.startswith("[") and token.endswith("]")
        ):
            return token
        return token[1:] if token.startswith(SPACE) else "##" + token

    words = [bert_form(t, k) for t, k in zip(tokens, types, strict=True)]
    unk = _unk_token(words, types, meta) or "[UNK]"
    backend = Backend(models.WordPiece(_token_index(words), unk_token=unk))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    _add_token_types(backend, words, types)
    # llama.cpp leads with [CLS] and closes with [SEP]
    cls = meta("tokenizer.ggml.bos_token_id", meta("tokenizer.ggml.cls_token_id", None))
    sep = meta("tokenizer.ggml.seperator_token_id", meta("tokenizer.ggml.eos_token_id", None))
    add_sep = bool(meta("tokenizer.ggml.add_sep_token", True)) and sep is not None
    return Vocab(
        backend,
        None if cls is None else int(cls),
        add_bos=bool(meta("tokenizer.ggml.add_bos_token", True)),
        append_ids=(int(sep),) if add_sep else (),
        normalizer_keeps_length=False,
    )
