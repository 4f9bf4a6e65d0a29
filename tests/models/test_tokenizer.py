"""Our GGUF-built tokenizer and chat template against what HF transformers fed its model."""

from vtllm.models.chat_template import render_chat
from vtllm.models.tokenizer import IncrementalDetokenizer


def test_prompt_ids_match_hf(default_model, goldens):
    tok = default_model.tokenizer
    for prompt in goldens["prompts"]:
        text = prompt["rendered"] if prompt["kind"] == "chat" else prompt["text"]
        assert tok.encode(text) == prompt["prompt_ids"], prompt["name"]


def test_chat_template_matches_hf(default_model, goldens):
    tok = default_model.tokenizer
    for prompt in goldens["prompts"]:
        if prompt["kind"] != "chat":
            continue
        rendered = render_chat(tok.chat_template, prompt["messages"], add_generation_prompt=True)
        assert rendered == prompt["rendered"], prompt["name"]


def test_decode_roundtrip_tricky_text(default_model):
    tok = default_model.tokenizer
    text = "Digits 2024+15=2039, café, 日本語, emoji 🙂, tabs\tand\nnewlines  "
    assert tok.decode(tok.encode(text)) == text


def test_incremental_detokenizer_never_splits_characters(default_model):
    tok = default_model.tokenizer
    text = "A 🙂 and 日本語 mixed with ascii, then more: ñandú 🎉."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_skipped_special_tokens_render_as_in_a_whole_decode_and_stay_out_of_the_window(
    default_model,
):
    tok = default_model.tokenizer
    eos = tok.eos_token_ids[0]
    assert eos in tok.special_ids and tok.decode([eos]) == ""
    ids = tok.encode("Hello, wörld 🙂 again")
    mixed = [eos, *ids[:3], eos, eos, *ids[3:], *[eos] * 1000, *ids]
    detok = IncrementalDetokenizer(tok, [eos, *ids[:2]])
    pieces = [detok.push([i]) for i in mixed]
    assert "".join(pieces) == tok.decode(mixed)
    # 1,000 EOS in a row (ignore_eos) did not widen the decoded window
    assert len(detok.ids) - detok.prefix_offset <= 8


def test_special_tokens_are_text_when_not_skipped(default_model):
    tok = default_model.tokenizer
    eos = tok.eos_token_ids[0]
    ids = [*tok.encode("Hi"), eos, *tok.encode(" there")]
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=False)
    assert tok.special_token(eos) in "".join(pieces)
