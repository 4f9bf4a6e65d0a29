"""SentencePiece vocabularies for the GGUF tokenizer tests: small models trained on a generated
corpus, written to GGUF as llama.cpp's converter writes them, and llama.cpp's own rules as
references where sentencepiece's differ."""

import io
import random

import sentencepiece as spm
from gguf import GGUFWriter

from vtllm.models.gguf_file import GGUFFile
from vtllm.models.gguf_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED
from vtllm.models.tokenizer import from_gguf

_SYLLABLES = "ka to ri mu se na lo pe chi zu wa the ing er an ou ré ü ß 日 本 語 при вет".split()


def training_lines(seed=0, n=3000):
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
        sentence_iterator=iter(training_lines()),
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


def write_spm_model(directory, model: bytes):
    """A tiny llama GGUF (F32 weights, tied embeddings) with the SentencePiece vocabulary, as
    llama.cpp's converter writes a Llama-2 / Mistral checkpoint."""
    from vtllm.models.gguf_writer import permute_qk
    from vtllm.models.synthetic import hf_config, random_weights

    sp = spm.SentencePieceProcessor(model_proto=model)
    cfg = hf_config("tiny", tie=True, vocab=sp.vocab_size())
    weights = random_weights(cfg, seed=4)
    # byte tokens' rows zeroed (tied head: their logits 0) so that greedy text is readable
    weights["model.embed_tokens.weight"][[sp.is_byte(i) for i in range(sp.vocab_size())]] = 0
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    path = directory / "tiny-spm.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_vocab_size(sp.vocab_size())
    write_vocab(writer, model)
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        writer.add_tensor(g + "attn_norm.weight", weights[h + "input_layernorm.weight"])
        writer.add_tensor(g + "ffn_norm.weight", weights[h + "post_attention_layernorm.weight"])
        for short, name, permute in (("q", "attn_q", heads), ("k", "attn_k", kv_heads)):
            w = weights[h + f"self_attn.{short}_proj.weight"]
            writer.add_tensor(g + name + ".weight", permute_qk(w, permute))
        writer.add_tensor(g + "attn_v.weight", weights[h + "self_attn.v_proj.weight"])
        writer.add_tensor(g + "attn_output.weight", weights[h + "self_attn.o_proj.weight"])
        for short in ("gate", "up", "down"):
            writer.add_tensor(g + f"ffn_{short}.weight", weights[h + f"mlp.{short}_proj.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
