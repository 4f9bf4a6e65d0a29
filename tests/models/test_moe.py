"""Qwen3-MoE and Mixtral against HF transformers: tiny random checkpoints drawn from a seed
(tests/models/moe_tiny.py), HF's logits and greedy tokens of them committed in
tests/goldens/moe_references.json (tests/goldens/make_moe_references.py made them); batch
invariance of the routed experts; the routing kernels against numpy; the refusals."""

import inspect
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from tests.models import moe_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.executor.cpu_ops import CpuOps
from vtllm.executor.kv_cache import allocate_kv_cache
from vtllm.executor.runner import ModelRunner
from vtllm.kernels import QType, reference
from vtllm.kernels.cpu import fast
from vtllm.kernels.cpu import moe as moe_kernels
from vtllm.kernels.cpu.quant import quantize
from vtllm.llm import LLM
from vtllm.models import moe_checkpoint, registry
from vtllm.models.loader import load_model
from vtllm.models.ops import MoeOps, Ops
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors
from vtllm.models.weights import Weight, weight_from_array
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

REFS = json.loads((Path(__file__).parents[1] / "goldens/moe_references.json").read_text())


def write(directory: Path, name: str, arrays=None, config: dict | None = None) -> Path:
    save_safetensors(directory / "model.safetensors", arrays or moe_tiny.tensors(name))
    (directory / "config.json").write_text(json.dumps(config or moe_tiny.CONFIGS[name]))
    vocab = moe_tiny.CONFIGS[name]["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


@pytest.fixture(scope="module", params=sorted(moe_tiny.CONFIGS))
def model(request, tmp_path_factory):
    name = request.param
    ref = REFS["models"][name]
    assert moe_tiny.digest(moe_tiny.tensors(name)) == ref["weights_sha256"]
    loaded = load_model(write(tmp_path_factory.mktemp(name), name))
    return name, ref, make_runner(loaded, num_blocks=40, max_model_len=96)


def test_logits_match_hf(model):
    _, ref, runner = model
    ids = ref["prompt_ids"] + ref["output_ids"]
    ours = teacher_forced_logits(runner, ids, [len(ids)])
    top, want = np.array(ref["top_ids"]), np.array(ref["top_logits"], np.float32)
    got = np.take_along_axis(ours, top, axis=1)
    scale = np.abs(want).max(axis=1, keepdims=True)
    assert np.max(np.abs(got - want) / scale) < 1e-5  # measured: 1.1e-6
    clear = np.array(ref["margins"]) > 1e-2
    assert clear.mean() > 0.95
    assert np.array_equal(ours.argmax(1)[clear], top[clear, 0])


def test_greedy_matches_hf_and_chunks_are_invisible(model):
    _, ref, runner = model
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    ids = prompt + out
    decode = teacher_forced_logits(runner, ids, [len(prompt)] + [1] * len(out))
    assert decode[len(prompt) - 1 : -1].argmax(1).tolist() == out
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    chunked = teacher_forced_logits(runner, ids, [5, 11, 3, 17, 9, 27])
    assert np.array_equal(whole, decode)
    assert np.array_equal(whole, chunked)


def _step(runner, step_id, seated: dict, chunks: list, blocks: dict) -> list[np.ndarray]:
    """One step over several slots: seated, slot -> ids seated this step; chunks, (slot,
    start, num_tokens); blocks, slot -> its block ids. Returns each chunk's logits rows."""
    bs = runner.block_size
    seats = [
        SeatedRequest(slot, ids, len(ids), SamplingParams(temperature=0), 0, [])
        for slot, ids in seated.items()
    ]
    plan_chunks = [
        Chunk(slot, start, n, blocks[slot][-(-start // bs) : -(-(start + n) // bs)], False, True)
        for slot, start, n in chunks
    ]
    logits, _ = runner.compute_logits(StepPlan(step_id, seats, plan_chunks, []))
    return np.split(logits.copy(), np.cumsum([n for *_, n in chunks])[:-1])


def test_a_tokens_bits_do_not_depend_on_its_batch(tmp_path):
    """The same prompt alone and inside a batch (other prompts before and after it, so its
    rows sit elsewhere and every expert sees other rows with it): equal logits bits; and a
    one-token decode alone and beside another prompt's prefill."""
    runner = make_runner(load_model(write(tmp_path, "qwen3_moe")), num_blocks=40)
    rng = np.random.default_rng(3)
    a = moe_tiny.prompt("qwen3_moe")
    b = rng.integers(3, 320, 37).tolist()
    c = rng.integers(3, 320, 13).tolist()
    blocks = {0: list(range(1, 11)), 1: list(range(11, 21)), 2: list(range(21, 25))}
    (alone,) = _step(runner, 0, {0: a}, [(0, 0, len(a))], blocks)
    chunks = [(1, 0, len(b)), (0, 0, len(a)), (2, 0, len(c))]
    _, together, _ = _step(runner, 1, {1: b, 0: a, 2: c}, chunks, blocks)
    assert np.array_equal(alone, together)
    # decode: a's last token after its first 39, alone, then beside b's whole prompt
    n = len(a) - 1
    _step(runner, 2, {0: a}, [(0, 0, n)], blocks)
    (last_alone,) = _step(runner, 3, {}, [(0, n, 1)], blocks)
    _step(runner, 4, {0: a}, [(0, 0, n)], blocks)
    last_beside, _ = _step(runner, 5, {1: b}, [(0, n, 1), (1, 0, len(b))], blocks)
    assert np.array_equal(last_alone, last_beside)
    assert np.array_equal(last_alone[0], alone[-1])


def test_llm_generates_hf_greedy_tokens_beside_other_prompts(tmp_path):
    """Through the LLM class (engine, scheduler, sampler): HF's greedy tokens, for the
    reference prompt twice and between them a prompt of its own."""
    ref = REFS["models"]["mixtral"]
    llm = LLM(str(write(tmp_path, "mixtral")), max_model_len=96)
    try:
        other = moe_tiny.prompt("mixtral", seed=1)[:17]
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        outs = llm.generate([ref["prompt_ids"], other, ref["prompt_ids"]], params)
    finally:
        llm.close()
    assert outs[0].outputs[0].token_ids == ref["output_ids"]
    assert outs[2].outputs[0].token_ids == ref["output_ids"]


def test_dense_layers_where_the_config_says(tmp_path):
    loaded = load_model(write(tmp_path, "qwen3_moe"))
    assert [layer.moe is None for layer in loaded.weights.layers] == [False, True, False]
    c = loaded.config
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (8, 2, 32)
    assert loaded.weights.layers[1].down.shape == (64, 96)
    assert loaded.weights.layers[0].moe.down[3].shape == (64, 32)
    step2 = moe_checkpoint.read_config(
        moe_tiny.CONFIGS["qwen3_moe_step2"], registry.lookup("qwen3_moe"), Path("c")
    )
    assert [step2.is_moe_layer(i) for i in range(4)] == moe_tiny.sparse_layers(
        moe_tiny.CONFIGS["qwen3_moe_step2"]
    )
    assert [step2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    # every matrix is counted once, experts and routers included (a layer's norms are not)
    arrays = moe_tiny.tensors("qwen3_moe")
    layer_norm = ("layernorm.weight", "q_norm.weight", "k_norm.weight")
    counted = [a.nbytes for n, a in arrays.items() if not n.endswith(layer_norm)]
    assert loaded.weights.nbytes == sum(counted)


def test_transformers5_fused_expert_layout_reads_the_same(tmp_path):
    """One 3-D gate_up_proj / down_proj per layer (Mixtral under mlp.), as transformers 5
    holds them: the same logits bits as the hub's per-expert matrices."""
    cfg = moe_tiny.CONFIGS["mixtral"]
    arrays = moe_tiny.tensors("mixtral")
    fused = {}
    for name, value in arrays.items():
        if ".experts." not in name:
            fused[name.replace(".block_sparse_moe.", ".mlp.")] = value
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.block_sparse_moe.experts."
        e = range(cfg["num_local_experts"])
        gate_up = [
            np.concatenate([arrays[f"{p}{j}.w1.weight"], arrays[f"{p}{j}.w3.weight"]]) for j in e
        ]
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(gate_up)
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack(
            [arrays[f"{p}{j}.w2.weight"] for j in e]
        )
    (tmp_path / "hub").mkdir()
    (tmp_path / "t5").mkdir()
    hub = make_runner(load_model(write(tmp_path / "hub", "mixtral")), max_model_len=32)
    t5 = make_runner(load_model(write(tmp_path / "t5", "mixtral", fused)), max_model_len=32)
    ids = moe_tiny.prompt("mixtral")[:20]
    want = teacher_forced_logits(hub, ids, [len(ids)])
    assert np.array_equal(teacher_forced_logits(t5, ids, [len(ids)]), want)


def test_fast_numerics_runs_moe_op_by_op(tmp_path):
    """The fast table has no fused MoE layer: the forward runs its ops, whose float weights
    take the exact kernels, so the logits are the exact table's bits."""
    loaded = load_model(write(tmp_path, "qwen3_moe"))
    ids = moe_tiny.prompt("qwen3_moe")[:24]
    exact = teacher_forced_logits(make_runner(loaded, max_model_len=32), ids, [len(ids)])
    kv = allocate_kv_cache(loaded.config, 64, 4)
    quick = ModelRunner(loaded, fast, kv, max_num_seqs=4, max_model_len=32)
    assert np.array_equal(teacher_forced_logits(quick, ids, [len(ids)]), exact)


def test_fast_numerics_takes_int8_in_quantized_experts(tmp_path):
    """Q8_0 experts under the fast table: int8 activations in every expert's linears (not
    the exact table's bits, but near them), and still batch-invariant."""
    loaded = load_model(write(tmp_path, "qwen3_moe"))
    for layer in loaded.weights.layers:
        if layer.moe is not None:
            m = layer.moe
            m.gate_up = [[_q8(w) for w in pair] for pair in m.gate_up]
            m.down = [_q8(w) for w in m.down]
    ids = moe_tiny.prompt("qwen3_moe")
    exact = teacher_forced_logits(make_runner(loaded), ids, [40])
    kv = allocate_kv_cache(loaded.config, 64, 4)
    quick = ModelRunner(loaded, fast, kv, max_num_seqs=4, max_model_len=96)
    alone = teacher_forced_logits(quick, ids, [40])
    err = np.abs(alone - exact).max(axis=1) / np.abs(exact).max(axis=1)
    assert 0 < np.median(err) < 0.03  # measured: 0.009 (int8 rounding of each activation)
    assert (alone.argmax(1) == exact.argmax(1)).mean() > 0.9
    blocks = {0: list(range(1, 11)), 1: list(range(11, 21))}
    other = np.random.default_rng(9).integers(3, 320, 33).tolist()
    _, together = _step(quick, 9, {1: other, 0: ids}, [(1, 0, 33), (0, 0, 40)], blocks)
    assert np.array_equal(alone, together)


def _q8(w: Weight) -> Weight:
    return weight_from_array(quantize(np.asarray(w.data), QType.Q8_0), QType.Q8_0, w.shape)


@pytest.mark.parametrize(
    "name,change,message",
    [
        ("qwen3_moe", {"shared_expert_intermediate_size": 64}, "shared expert"),
        ("qwen3_moe", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("qwen3_moe", {"use_sliding_window": True}, "use_sliding_window"),
        ("qwen3_moe", {"num_experts_per_tok": 9}, "num_experts_per_tok 9 of 8"),
        ("qwen3_moe", {"attention_bias": True}, "attention_bias"),
        ("mixtral", {"sliding_window": 16}, "sliding_window 16"),
        ("mixtral", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
    ],
)
def test_unsupported_settings_are_refused_in_one_line(tmp_path, name, change, message):
    write(tmp_path, name, config={**moe_tiny.CONFIGS[name], **change})
    with pytest.raises(UnsupportedModel, match=message) as err:
        load_model(tmp_path)
    assert "\n" not in str(err.value)


def test_a_missing_expert_is_named(tmp_path):
    arrays = moe_tiny.tensors("mixtral")
    del arrays["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    with pytest.raises(ModelLoadError, match=r"experts\.2\.w3\.weight is missing"):
        load_model(write(tmp_path, "mixtral", arrays))


def test_the_cuda_runner_takes_them_and_gguf_names_map():
    for name in ("qwen3_moe", "mixtral"):  # the CUDA forward: tests/kernels_cuda/test_moe*.py
        registry.check_cuda(name)
    # llama.cpp's names: qwen3moe, and Mixtral as llama with experts (tests/models/test_moe_gguf)
    assert registry.family("qwen3moe", 8).name == "qwen3_moe"
    assert (registry.family("llama", 8).name, registry.family("llama").name) == ("mixtral", "llama")
    with pytest.raises(UnsupportedModel, match="'qwen3' with 8 experts"):
        registry.family("qwen3", 8)


def test_cpu_ops_implement_moe_ops():
    for name in set(vars(MoeOps)) - set(vars(Ops)):
        if not name.startswith("_") and callable(getattr(MoeOps, name)):
            want = list(inspect.signature(getattr(MoeOps, name)).parameters)
            assert list(inspect.signature(getattr(CpuOps, name)).parameters) == want, name


@pytest.mark.parametrize("renormalize", [False, True])
def test_routing_kernels_against_numpy(renormalize):
    rng = np.random.default_rng(5)
    t, e, k, hidden = 37, 8, 3, 20
    logits = rng.standard_normal((t, e)).astype(np.float32)
    logits[0] = [0.5, 2.0, 1.0, 2.0, 0.0, 2.0, -1.0, 1.0]  # a three-way tie at the top
    logits[1] = [1.0, 0.0, 1.5, 1.5, 1.5, 0.0, 0.0, 0.0]  # k cuts through a tie
    ids = np.empty((t, k), np.int32)
    weights = np.empty((t, k), np.float32)
    moe_kernels.route_top_k(logits, renormalize, ids, weights)
    want_ids, want_w = reference.route_top_k_ref(logits, k, renormalize)
    assert np.array_equal(ids, want_ids)
    assert ids[0].tolist() == [1, 3, 5] and ids[1].tolist() == [2, 3, 4]
    assert np.allclose(weights, want_w, rtol=1e-6, atol=0)
    # grouped by expert, then summed back per token in rank order
    order = np.empty(t * k, np.int32)
    position = np.empty(t * k, np.int32)
    offsets = np.empty(e + 1, np.int32)
    moe_kernels.group_by_expert(ids, e, order, position, offsets)
    flat = ids.reshape(-1)
    assert np.array_equal(order, np.argsort(flat, kind="stable"))
    assert np.array_equal(order[position], np.arange(t * k))
    assert np.array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(flat, None, e))]))
    ys = rng.standard_normal((t * k, hidden)).astype(np.float32)
    out = np.empty((t, hidden), np.float32)
    moe_kernels.combine(ys, position, weights, out)
    want = reference.combine_ref(ys, position, weights)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="top-k 9 of 8"):
        moe_kernels.route_top_k(logits, True, np.empty((t, 9), np.int32), weights)


def test_config_defaults_are_the_transformers_classes():
    fam = registry.lookup("mixtral")
    raw = {"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2}
    c = moe_checkpoint.read_config(raw, fam, Path("c"))
    want = (4096, 14336, 8, 2, 1e6, 1e-5, 131072, True, (2,))
    got = (c.hidden_size, c.intermediate_size, c.num_experts, c.num_experts_per_tok)
    got += (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings, c.norm_topk_prob)
    assert got + (c.eos_token_ids,) == want
    q = moe_checkpoint.read_config({}, registry.lookup("qwen3_moe"), Path("c"))
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size) == (128, 8, 768)
    assert (q.norm_topk_prob, q.rope_theta, q.num_kv_heads, q.head_dim) == (False, 1e4, 4, 64)
    # transformers 5 saves rope_parameters in place of rope_theta / rope_scaling
    new = {**moe_tiny.CONFIGS["qwen3_moe"], "rope_parameters": {"rope_theta": 5e5}}
    del new["rope_theta"]
    qwen = registry.lookup("qwen3_moe")
    c5 = moe_checkpoint.read_config(new, qwen, Path("c"))
    old = moe_checkpoint.read_config(moe_tiny.CONFIGS["qwen3_moe"], qwen, Path("c"))
    assert c5 == msgspec.structs.replace(old, rope_theta=5e5)


def test_synthetic_moe_shapes_load_and_run(tmp_path):
    """models/synthetic's Qwen3-MoE shapes (bench gpu's qwen3-30b-a3b at its real width) load
    as routed layers; the tiny one runs."""
    from vtllm.models.synthetic import hf_config, write_checkpoint

    big = hf_config("qwen3-30b-a3b")
    assert (big["num_experts"], big["num_experts_per_tok"], big["moe_intermediate_size"]) == (
        128,
        8,
        768,
    )
    loaded = load_model(write_checkpoint(tmp_path, "tiny-qwen3-moe", seed=1))
    c = loaded.config
    assert (c.architecture, c.num_experts, c.num_experts_per_tok) == ("qwen3_moe", 8, 2)
    assert all(
        layer.moe is not None and len(layer.moe.down) == 8 for layer in loaded.weights.layers
    )
    logits = teacher_forced_logits(make_runner(loaded), [5, 9, 17, 3], [4])
    assert logits.shape == (4, 512) and np.isfinite(logits).all()
