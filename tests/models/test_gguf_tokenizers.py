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

import pytest
import sentencepiece as spm
from gguf import GGUFWriter

from tests.models.spm_util import (
    gguf_tokenizer,
    llama_cpp_spm,
    split_at_tokens,
    train,
    training_lines,
    write_spm_model,
)
from vtllm.errors import UnsupportedModel
from vtllm.models.gguf_file import GGUFFile
from vtllm.models.gguf_vocab import CONTROL, NORMAL
from vtllm.models.tokenizer import IncrementalDetokenizer, from_gguf

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
    ref.train_from_iterator(training_lines(1), vocab_size=800, show_progress=False)
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


def test_llama_gguf_with_spm_vocabulary_generates(tmp_path, bpe_model):
    import subprocess
    import sys

    from vtllm import LLM, SamplingParams
    from vtllm.scheduler.sampling_params import StructuredOutputs

    sp = spm.SentencePieceProcessor(model_proto=bpe_model)
    path = write_spm_model(tmp_path, bpe_model)
    llm = LLM(str(path), max_model_len=64, kv_cache_memory=1 << 20, block_size=4)
    assert llm.loaded.config.vocab_size == sp.vocab_size()
    prompt = "Kato rimu sena 🙂"
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    out = llm.generate(prompt, params)[0]
    assert out.prompt_token_ids == [sp.bos_id(), *sp.encode(prompt)]
    ids = list(out.outputs[0].token_ids)
    assert out.outputs[0].text == llm.loaded.tokenizer.decode(ids) == sp.decode(ids) != ""
    assert llm.generate([out.prompt_token_ids], params)[0].outputs[0].token_ids == ids
    # the grammar engine reads the same vocabulary (byte pieces spell the emoji)
    choices = ["kato rimu 🙂", "sena lope"]
    guided = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputs(choice=choices))
    assert llm.generate("Kato", guided)[0].outputs[0].text in choices
    cli = subprocess.run(
        [sys.executable, "-m", "vtllm", "generate", "--model", str(path), "--prompt", prompt]
        + ["--max-tokens", "8", "--temperature", "0", "--ignore-eos", "--max-model-len", "64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.rstrip("\n") == out.outputs[0].text


def test_gpt2_user_defined_tokens_are_cut_out_of_text(tmp_path):
    """llama.cpp's converter writes a BPE vocabulary's user-defined tokens as raw text; like
    llama.cpp (and HF's added tokens) the text is that token wherever it stands."""
    from tokenizers import pre_tokenizers

    from vtllm.models.gguf_vocab import USER_DEFINED

    tokens = ["<|endoftext|>", *sorted(pre_tokenizers.ByteLevel.alphabet()), "\n\n  ü", "Ġb"]
    types = [CONTROL, *[NORMAL] * 256, USER_DEFINED, NORMAL]
    path = tmp_path / "bpe.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ b"])
    writer.add_eos_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    tok = from_gguf(GGUFFile(path), path, lambda r, key, default=None: r.fields.get(key, default))
    ids = tok.encode("a\n\n  ü b<|endoftext|>")
    assert ids == [tokens.index("a"), 257, 258, 0]
    assert tok.decode(ids) == "a\n\n  ü b" and tok.special_ids == {0}
