"""Tokenizers built from GGUF vocabularies against their references, id for id.

SentencePiece models (BPE and unigram, byte fallback on, as Llama's and T5's) are trained here
on a generated corpus and written to GGUF as llama.cpp's converter writes them: pieces, scores
and token types, the BOS / EOS / UNK ids and the add-BOS, add-space-prefix flags. The
references are sentencepiece itself for plain text, llama.cpp's rule for text holding special
or user-defined tokens (each run of text between them tokenized on its own, with its own space
prefix), and for a unigram vocabulary that llama.cpp reads as "llama" its greedy algorithm
(adjacent pieces merged best score first). A WordPiece vocabulary trained by `tokenizers` is
the reference of the "bert" model.
"""

import io
import random

import pytest
from gguf import GGUFWriter

from vtllm.errors import UnsupportedModel
from vtllm.models.gguf_file import GGUFFile
from vtllm.models.gguf_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED
from vtllm.models.tokenizer import IncrementalDetokenizer, from_gguf

spm = pytest.importorskip("sentencepiece")

_SYLLABLES = "ka to ri mu se na lo pe chi zu wa the ing er an ou ré ü ß 日 本 語 при вет".split()
CORPUS = [
    "Hello world",
    " leading space",
    "  two leading spaces",
    "trailing spaces  ",
    "new\nlines\n\nand a blank one\n",
    "tabs\tand\r\ncarriage returns",
    "café naïve über straße",
    "日本語 при вет",
    "emoji 🙂🎉 bytes fall back",
    "digits 12345 and 3.14159",
    "",
    " ",
    "\n",
    "katorimu sena lope chiwa",
    "Kato. Rimu sena! (zuthe) 'ingan'",
    "x" * 60,
    "ü" * 12 + " ß",
    "ࠀ unseen scripts ᚠᛇ and ﬁ ① Ｈｅｌｌｏ",
    "a   b\t\tc    d",
]
SPECIAL_CORPUS = [
    "<s>Hello</s> world",
    "</s>",
    " <s> ",
    "<s>\nkato",
    "x<unk>y",
    "a <tool> b<tool>c",
    "<tool>",
    "<s><s>",
]


def _training_lines(seed=0, n=3000):
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    lines = []
    for _ in range(n):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 15)))
        if rng.random() < 0.3:
            line += f" {rng.randint(0, 99999)}"
        if rng.random() < 0.2:
            line = line.capitalize() + "."
        lines.append(line)
    return lines


def train(kind, *, normalization="identity", dummy_prefix=True, user_symbols=("<tool>",)):
    """A small SentencePiece model: Llama's settings unless told otherwise."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_lines()),
        model_writer=out,
        model_type=kind,
        vocab_size=1000 if kind == "bpe" else 600,
        hard_vocab_limit=False,
        byte_fallback=True,
        normalization_rule_name=normalization,
        remove_extra_whitespaces=normalization != "identity",
        add_dummy_prefix=dummy_prefix,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        user_defined_symbols=list(user_symbols),
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def _proto_fields(data: bytes):
    """(field number, value) of a protobuf message: enough to read a model's normalizer."""
    i = 0

    def varint():
        nonlocal i
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(data):
        key = varint()
        wire = key & 7
        if wire == 0:
            value = varint()
        elif wire == 2:
            n = varint()
            value, i = data[i : i + n], i + n
        else:
            n = 4 if wire == 5 else 8
            value, i = data[i : i + n], i + n
        yield key >> 3, value


def precompiled_charsmap(model: bytes) -> bytes:
    normalizer = next((v for k, v in _proto_fields(model) if k == 3), b"")
    return next((bytes(v) for k, v in _proto_fields(normalizer) if k == 2), b"")


def token_types(sp):
    """llama.cpp's converter's token type per piece."""
    types = []
    for i in range(sp.vocab_size()):
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_unused(i):
            types.append(UNUSED)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.id_to_piece(i) == "<tool>":
            types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
    return types


def write_vocab(writer: GGUFWriter, model: bytes, tokenizer_model="llama", **flags):
    """The tokenizer metadata llama.cpp's converter writes for a SentencePiece model."""
    sp = spm.SentencePieceProcessor(model_proto=model)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list([sp.id_to_piece(i) for i in range(sp.vocab_size())])
    writer.add_token_scores([sp.get_score(i) for i in range(sp.vocab_size())])
    writer.add_token_types(token_types(sp))
    writer.add_unk_token_id(sp.unk_id())
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_add_bos_token(flags.get("add_bos", tokenizer_model == "llama"))
    writer.add_add_eos_token(flags.get("add_eos", tokenizer_model == "t5"))
    if "add_space_prefix" in flags:
        writer.add_add_space_prefix(flags["add_space_prefix"])
    if tokenizer_model == "t5":
        writer.add_remove_extra_whitespaces(flags.get("remove_extra_whitespaces", True))
        charsmap = precompiled_charsmap(model)
        if charsmap:
            writer.add_precompiled_charsmap(charsmap)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def gguf_tokenizer(tmp_path, model: bytes, tokenizer_model="llama", **flags):
    path = tmp_path / f"vocab-{tokenizer_model}-{len(list(tmp_path.iterdir()))}.gguf"
    writer = GGUFWriter(str(path), "llama")
    write_vocab(writer, model, tokenizer_model, **flags)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return from_gguf(GGUFFile(path), path, lambda r, key, default=None: r.fields.get(key, default))


@pytest.fixture(scope="module")
def bpe_model():
    return train("bpe")


@pytest.fixture(scope="module")
def unigram_model():
    return train("unigram")


def test_spm_bpe_matches_sentencepiece(tmp_path, bpe_model):
    sp = spm.SentencePieceProcessor(model_proto=bpe_model)
    tok = gguf_tokenizer(tmp_path, bpe_model)
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text), text
        assert tok.encode(text) == [sp.bos_id(), *ids]
        assert tok.decode(ids) == sp.decode(ids) == text, text
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)


def llama_cpp_spm(sp, text: str, *, prefix=True) -> list[int]:
    """llama.cpp's SPM algorithm: start from characters, merge the adjacent pair whose text is
    a piece of the best score (the leftmost of equals) until none is; characters outside the
    vocabulary become their byte pieces."""
    if not text:
        return []
    vocab = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    symbols = list(((" " if prefix else "") + text).replace(" ", "\u2581"))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            piece = vocab.get(symbols[i] + symbols[i + 1])
            if piece is not None and (best is None or sp.get_score(piece) > best[0]):
                best = (sp.get_score(piece), i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    ids = []
    for s in symbols:
        ids += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode()]
    return ids


def split_at_tokens(sp, text, encode):
    """llama.cpp's rule for text holding special or user-defined tokens: the tokens are cut
    out, and each run of text between them is encoded alone, with its own space prefix."""
    pieces = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    kinds = (CONTROL, UNKNOWN, USER_DEFINED)
    names = [sp.id_to_piece(i) for i, kind in enumerate(token_types(sp)) if kind in kinds]
    names.sort(key=len, reverse=True)
    ids, run, i = [], "", 0
    while i < len(text):
        hit = next((n for n in names if text.startswith(n, i)), None)
        if hit is None:
            run += text[i]
            i += 1
            continue
        if run:
            ids += encode(run)
        ids.append(pieces[hit])
        run, i = "", i + len(hit)
    return ids + (encode(run) if run else [])


def test_spm_special_and_user_defined_tokens_follow_llama_cpp(tmp_path, bpe_model):
    sp = spm.SentencePieceProcessor(model_proto=bpe_model)
    tok = gguf_tokenizer(tmp_path, bpe_model)
    for text in SPECIAL_CORPUS:
        assert tok.encode(text, add_special_tokens=False) == split_at_tokens(sp, text, sp.encode), (
            text
        )
    ids = tok.encode("<s>kato</s>", add_special_tokens=False)
    assert tok.decode(ids) == "kato"
    assert tok.decode(ids, skip_special_tokens=False) == "<s> kato</s>"
    assert tok.special_ids >= {0, 1, 2} and 3 not in tok.special_ids  # <tool> is plain text


def test_unigram_vocabulary_as_llama_merges_by_score(tmp_path, unigram_model):
    """llama.cpp reads every "llama" vocabulary with its greedy merges, a unigram one too."""
    sp = spm.SentencePieceProcessor(model_proto=unigram_model)
    tok = gguf_tokenizer(tmp_path, unigram_model)
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == llama_cpp_spm(sp, text), text
        assert tok.decode(ids) == text
    for text in SPECIAL_CORPUS:
        reference = split_at_tokens(sp, text, lambda run: llama_cpp_spm(sp, run))
        assert tok.encode(text, add_special_tokens=False) == reference, text


def test_spm_without_space_prefix(tmp_path):
    model = train("bpe", dummy_prefix=False)
    sp = spm.SentencePieceProcessor(model_proto=model)
    tok = gguf_tokenizer(tmp_path, model, add_space_prefix=False)
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text) == llama_cpp_spm(sp, text, prefix=False), text
        assert tok.decode(ids) == text


def test_spm_incremental_detokenizer_and_token_bound(tmp_path, bpe_model):
    tok = gguf_tokenizer(tmp_path, bpe_model)
    text = "Kato 🙂 rimu 日本語,  sena\n\tü 🎉 end "
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, ids[:1])
    pieces = [detok.push([i]) for i in ids[1:]]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
    for text in [*CORPUS, " " * 500, "\u2581" * 300, "🙂" * 100, "<s>" * 50]:
        assert tok.min_tokens(text) <= len(tok.encode(text, add_special_tokens=False)), text
    assert tok.max_token_bytes > 0


@pytest.mark.parametrize("normalization", ["nmt_nfkc", "identity"])
def test_t5_unigram_matches_sentencepiece(tmp_path, normalization):
    model = train("unigram", normalization=normalization, user_symbols=())
    sp = spm.SentencePieceProcessor(model_proto=model)
    tok = gguf_tokenizer(
        tmp_path, model, "t5", remove_extra_whitespaces=normalization != "identity"
    )
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == sp.decode(ids), text
        assert tok.encode(text) == [*ids, sp.eos_id()]  # T5 closes with EOS, has no BOS


def test_bert_wordpiece_matches_tokenizers(tmp_path):
    from tokenizers import BertWordPieceTokenizer

    ref = BertWordPieceTokenizer(lowercase=True)
    ref.train_from_iterator(_training_lines(1), vocab_size=800, show_progress=False)
    vocab = sorted(ref.get_vocab().items(), key=lambda kv: kv[1])
    # llama.cpp's converter: word-initial pieces get "▁", continuations lose "##"
    phantom = [
        t if t.startswith("[") and t.endswith("]") else t[2:] if t.startswith("##") else "▁" + t
        for t, _ in vocab
    ]
    specials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    path = tmp_path / "bert.gguf"
    writer = GGUFWriter(str(path), "bert")
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(phantom)
    writer.add_token_types([CONTROL if t in specials else NORMAL for t, _ in vocab])
    # llama.cpp keeps [CLS] as the BOS token
    for key, name in [("unk", "[UNK]"), ("bos", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]")]:
        getattr(writer, f"add_{key}_token_id")(ref.token_to_id(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    tok = from_gguf(GGUFFile(path), path, lambda r, key, default=None: r.fields.get(key, default))
    cls, sep = ref.token_to_id("[CLS]"), ref.token_to_id("[SEP]")
    for text in [*CORPUS, "Hello, [SEP] there!", "UPPER lower Mixed-Case don't"]:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == ids, text
        assert tok.encode(text) == [cls, *ids, sep]
        assert tok.decode(ids) == ref.decode(ids), text


@pytest.mark.parametrize("model", ["rwkv", "plamo2", "no_vocab"])
def test_other_tokenizer_models_are_refused_by_name(tmp_path, model):
    path = tmp_path / "vocab.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with pytest.raises(UnsupportedModel, match=f"tokenizer model '{model}'"):
        from_gguf(GGUFFile(path), path, lambda r, key, default=None: r.fields.get(key, default))
