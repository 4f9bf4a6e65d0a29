"""The SentencePiece vocabulary llama.cpp's converter writes for a Gemma 2 / Gemma 3 / Phi-3
checkpoint with a tokenizer.model (the GGUF writer's; models/gguf_writer).

As the converter builds it: one entry per id up to the config's vocab_size, filler
`[PAD{i}]` tokens (score -10000, unused) where the model has none; each piece's score and
type (unknown, control, unused, byte, else normal); then the added tokens of added_tokens.json
and tokenizer_config.json's added_tokens_decoder (Phi-3: tokenizer.json's added_tokens too)
at score -1000, control when marked special (Gemma also when they look special: `<|...|>`,
`<unused...>`, `<mask>` ...), else user-defined. The special ids, add_bos / add_eos and the
chat template come from gguf's SpecialVocab, which the converter calls; Gemma files say
add_space_prefix false.
"""

import json
from pathlib import Path

from vtllm.errors import UnsupportedModel

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_PAD_SCORE, _ADDED_SCORE = -10000.0, -1000.0
_SPACE = "\u2581"


def uses_spm(directory: Path, fam: str) -> bool:
    """Whether the converter writes this checkpoint's vocabulary from tokenizer.model (Phi-4's
    tokenizer_config names GPT2Tokenizer: a BPE vocabulary instead)."""
    if not (directory / "tokenizer.model").is_file():
        return False
    if fam == "phi3":
        return _json(directory / "tokenizer_config.json").get("tokenizer_class") != "GPT2Tokenizer"
    return True


def write_spm_vocabulary(writer, directory: Path, vocab_size: int, fam: str) -> None:
    from gguf import SpecialVocab

    tokens, scores, types = _pieces(directory, vocab_size)
    _added_tokens(directory, tokens, scores, types, fam)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    SpecialVocab(directory, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    if fam != "phi3":
        writer.add_add_space_prefix(False)


def _pieces(directory: Path, vocab_size: int):
    try:
        import sentencepiece
    except ImportError:
        raise UnsupportedModel(
            f"{directory}: writing its tokenizer.model to GGUF needs the sentencepiece package"
        ) from None
    sp = sentencepiece.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores, types = [_PAD_SCORE] * vocab_size, [_UNUSED] * vocab_size
    for i in range(min(sp.vocab_size(), vocab_size)):
        tokens[i], scores[i] = sp.id_to_piece(i), sp.get_score(i)
        if sp.is_unknown(i):
            types[i] = _UNKNOWN
        elif sp.is_control(i):
            types[i] = _CONTROL
        elif sp.is_unused(i):
            types[i] = _UNUSED
        elif sp.is_byte(i):
            types[i] = _BYTE
        else:
            types[i] = _NORMAL
    return tokens, scores, types


def _added_tokens(directory: Path, tokens, scores, types, fam: str) -> None:
    """Added tokens over the pieces, in the converter's order of sources."""
    n = len(tokens)
    for text, i in _json(directory / "added_tokens.json").items():
        if i < n:
            tokens[i], scores[i], types[i] = text, _ADDED_SCORE, _USER_DEFINED
    entries = [
        (int(i), d)
        for i, d in _json(directory / "tokenizer_config.json")
        .get("added_tokens_decoder", {})
        .items()
    ]
    if fam == "phi3":
        added = _json(directory / "tokenizer.json").get("added_tokens", [])
        entries += [(int(d["id"]), d) for d in added]
    for i, entry in entries:
        if i >= n:
            continue
        text = entry["content"]
        special = bool(entry.get("special")) or (fam != "phi3" and _looks_special(text))
        if not special and fam != "phi3":
            text = text.replace(_SPACE, " ")  # the converter writes user-defined spaces plain
        tokens[i], scores[i] = text, _ADDED_SCORE
        types[i] = _CONTROL if special else _USER_DEFINED


def _looks_special(text: str) -> bool:
    """Added tokens some checkpoints leave unmarked that the converter treats as control."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UnsupportedModel(f"{path}: invalid JSON ({exc})") from None
