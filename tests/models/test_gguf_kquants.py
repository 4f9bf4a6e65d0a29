"""GGUF files with llama.cpp's K-quant mixes (Q4_K_M-like: Q4_K and Q6_K matrices, Q6_K or
Q8_0 embeddings, F32 norms) load and run, checked against the same weights dequantized to
float32: the exact numerics bit for bit, the `fast` numerics within their int8 noise."""

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize as gguf_quantize

from tests.kernels.kquant_blocks import random_kquant
from tests.models.reference_forward import reference_logits
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm import LLM, SamplingParams
from vtllm.executor.kv_cache import allocate_kv_cache
from vtllm.executor.runner import ModelRunner
from vtllm.kernels import KQUANTS, QType
from vtllm.kernels.cpu import fast
from vtllm.kernels.cpu.quant import dequantize, quantize
from vtllm.models.gguf_writer import permute_qk
from vtllm.models.loader import load_model
from vtllm.models.synthetic import hf_config, random_weights, save_safetensors, write_checkpoint

Q2, Q3, Q4, Q5, Q6, Q8 = QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q8_0
# name -> (most matrices, attn_v / ffn_down of layer 0, of layer 1, token_embd, output or None
# when tied), after llama.cpp's choices (more bits for some layers' v and down). Where a row is
# no multiple of 256 (SmolLM2's 576, Qwen2.5's 896) llama.cpp's mixes fall back to Q5_0 for
# Q4_K, Q5_1 for Q5_K and Q8_0 for Q6_K: "fallback" is such a file's mix.
MIXES = {
    "Q4_K_M": (Q4, Q6, Q4, Q6, None),
    "Q5_K_M": (Q5, Q6, Q5, Q8, Q6),
    "Q3_K_M": (Q3, Q5, Q4, Q6, None),
    "Q2_K": (Q2, Q3, Q4, Q8, Q6),
    "fallback": (QType.Q5_0, Q8, QType.Q5_1, Q8, None),
}
LAYERS = 2


def _config(tie: bool) -> dict:
    """The tiny llama config widened so every matrix's K is a multiple of 256."""
    cfg = hf_config("tiny", tie=tie, layers=LAYERS)
    cfg.update(hidden_size=256, intermediate_size=512, head_dim=64)
    return cfg


def _stored(rng, w: np.ndarray, qtype):
    """(bytes for the file, what they decode to). K-quants: random blocks whose scales are
    rescaled so the decoded matrix has w's spread (random weights either way)."""
    if qtype == QType.F32:
        return w, w
    if qtype in (QType.Q5_0, QType.Q5_1):
        blocks = gguf_quantize(w, GGMLQuantizationType(int(qtype)))
        return blocks, dequantize(blocks, qtype)
    if qtype not in KQUANTS:
        blocks = quantize(w, qtype)
        return blocks, dequantize(blocks, qtype)
    blocks = random_kquant(rng, qtype, *w.shape, lo=-3.0, hi=-2.0)
    factor = w.std() / dequantize(blocks, qtype).std()
    view = blocks.reshape(-1, blocks.shape[1] // (w.shape[1] // 256))
    for off in {QType.Q2_K: (80, 82), QType.Q3_K: (108,), QType.Q6_K: (208,)}.get(qtype, (0, 2)):
        half = view[:, off : off + 2].copy().view(np.float16).astype(np.float32) * factor
        view[:, off : off + 2] = half.astype(np.float16).view(np.uint8)
    return blocks, dequantize(blocks, qtype)


def write_mix(directory, mix: str):
    """(K-quant GGUF, the same weights as an F32 GGUF, an HF directory of them for the float64
    reference)."""
    main, v_down0, v_down1, embd, output = MIXES[mix]
    cfg = _config(tie=output is None)
    weights = random_weights(cfg, seed=5)
    rng = np.random.default_rng(7)
    tok = json.loads((write_checkpoint(directory / "hf", "tiny") / "tokenizer.json").read_text())
    vocab = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    tensors = []  # (gguf name, hf name, stored, decoded, qtype, heads to permute)

    def put(name, hf, qtype, heads=None):
        stored, used = _stored(rng, weights[hf], qtype)
        tensors.append((name, hf, stored, used, qtype, heads))

    put("token_embd.weight", "model.embed_tokens.weight", embd)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for i in range(LAYERS):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        more = v_down0 if i == 0 else v_down1
        put(p + "attn_norm.weight", h + "input_layernorm.weight", QType.F32)
        put(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", QType.F32)
        for short, name, qtype, perm in (
            ("q", "attn_q", main, heads),
            ("k", "attn_k", main, kv_heads),
            ("v", "attn_v", more, None),
            ("o", "attn_output", main, None),
        ):
            put(p + name + ".weight", h + f"self_attn.{short}_proj.weight", qtype, perm)
        for short, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
            put(
                p + name + ".weight",
                h + f"mlp.{short}_proj.weight",
                more if short == "down" else main,
            )
    put("output_norm.weight", "model.norm.weight", QType.F32)
    if output is not None:
        put("output.weight", "lm_head.weight", output)
    paths = []
    for dequantized in (False, True):
        path = directory / f"tiny-{mix}{'-f32' if dequantized else ''}.gguf"
        writer = GGUFWriter(str(path), "llama")
        writer.add_block_count(LAYERS)
        writer.add_context_length(256)
        writer.add_embedding_length(cfg["hidden_size"])
        writer.add_feed_forward_length(cfg["intermediate_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        writer.add_key_length(cfg["head_dim"])
        writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        writer.add_rope_freq_base(cfg["rope_theta"])
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(vocab)
        writer.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
        writer.add_token_merges([])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        for name, _, stored, used, qtype, perm in tensors:
            data, qtype = (used, QType.F32) if dequantized else (stored, qtype)
            if perm:
                data = permute_qk(data, perm)
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType(int(qtype)))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(path)
    reference_dir = directory / "ref"
    reference_dir.mkdir()
    (reference_dir / "config.json").write_text(json.dumps(cfg))
    save_safetensors(reference_dir / "model.safetensors", {t[1]: t[3] for t in tensors})
    return (*paths, reference_dir)


@pytest.fixture(scope="module", params=list(MIXES))
def mix(request, tmp_path_factory):
    quant_path, f32_path, reference_dir = write_mix(tmp_path_factory.mktemp("kq"), request.param)
    return request.param, load_model(quant_path), load_model(f32_path), reference_dir


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(3, 512, n).tolist()


def test_mix_loads_with_its_types(mix):
    name, quant, _, _ = mix
    main, v_down0, _, embd, output = MIXES[name]
    w = quant.weights
    assert w.embed.qtype == embd and w.layers[0].down.qtype == v_down0
    assert w.layers[0].o.qtype == main and len(w.layers[0].qkv) == 3  # q, k, v kept apart
    assert w.layers[1].down.qtype == MIXES[name][2]
    assert (w.lm_head is w.embed) == (output is None)


def test_exact_logits_are_the_dequantized_models_to_the_bit(mix):
    """The float32 kernels decode K-quant chunks to the very floats the F32 file holds and
    accumulate in the same order, so the logits agree bit for bit (prefill and decode steps);
    both match the independent float64 forward."""
    _, quant, f32, reference_dir = mix
    ids = _ids(40)
    ours = teacher_forced_logits(make_runner(quant), ids, [30, 1, 1, 8])
    assert np.array_equal(ours, teacher_forced_logits(make_runner(f32), ids, [30, 1, 1, 8]))
    ref = reference_logits(reference_dir, ids)
    assert np.max(np.abs(ours - ref) / np.abs(ref).max(axis=1, keepdims=True)) < 1e-4


def test_greedy_generation_is_token_exact(mix):
    _, quant, f32, _ = mix
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outs = []
    for loaded in (quant, f32):
        llm = LLM(loaded_model=loaded, max_model_len=256, kv_cache_memory=8 << 20)
        outs.append(
            [o.outputs[0].token_ids for o in llm.generate([_ids(9, 1), _ids(3, 2)], params)]
        )
        llm.backend.close()
    assert outs[0] == outs[1]


def test_fast_numerics_within_int8_noise(mix):
    """int8 activations (K-quant matrices in their int8 kernels where they have one): argmax
    equal to the float64 forward wherever the top-2 margin clears 6 sigma of the logit noise
    (see test_fast_numerics.py), and the noise small against the logits' spread."""
    _, quant, _, reference_dir = mix
    ids = _ids(40, seed=3)
    kv = allocate_kv_cache(quant.config, 64, 4)
    runner = ModelRunner(quant, fast, kv, max_num_seqs=4, max_model_len=256)
    ours = teacher_forced_logits(runner, ids, [30, 1, 1, 8]).astype(np.float64)
    ref = reference_logits(reference_dir, ids)
    sigma = np.sqrt(np.mean((ours - ref) ** 2, axis=1))
    assert (sigma / ref.std(axis=1)).mean() < 0.1
    top2 = np.sort(ref, axis=1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] > 6 * sigma
    assert sure.mean() > 0.3
    assert np.array_equal(ours.argmax(1)[sure], ref.argmax(1)[sure])
