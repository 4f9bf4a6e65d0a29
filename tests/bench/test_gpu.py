"""bench.gpu without a GPU: its arguments, the roofline arithmetic, the peers' output
parsers and the table. No timing here."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu as bench_gpu
from bench.gpu import Settings
from bench.gpu_peers import parse_batched_bench, parse_llama_bench
from vtllm.errors import InvalidParameter
from vtllm.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
# Llama-3.1-8B: the shape whose floors the GPU speed issue quotes (4.3 TB/s, 1k context)
LLAMA_8B = ModelConfig(
    architecture="llama",
    hidden_size=4096,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=5e5,
)


def _settings(*argv) -> Settings:
    return Settings(bench_gpu.build_parser().parse_args(list(argv)))


def test_defaults_and_flags_parse():
    s = _settings()
    assert s.shapes == ["qwen3-0.6b", "llama3-8b"]
    assert s.batches == [1, 8, 32, 64] and s.prompts == [128, 1024, 4096]
    assert s.peers == ["hf", "llamacpp"] and s.layers is None and s.json is None
    assert s.knobs["cuda_pdl"] and not s.knobs["cuda_flash_prefill"]
    assert _settings("--flash-prefill").knobs["cuda_flash_prefill"]
    assert s.knobs["cuda_prefill_gemm"] == "mma"
    assert _settings("--prefill-gemm", "wgmma").knobs["cuda_prefill_gemm"] == "wgmma"
    s = _settings(
        "--shapes",
        "llama3-8b",
        "--layers",
        "4",
        "--gguf",
        "/m.gguf",
        "--peers",
        "none",
        "--batches",
        "1,32",
        "--json",
        "--work",
        "/w",
    )
    assert s.ggufs == {"llama3-8b": "/m.gguf"} and s.peers == [] and s.batches == [1, 32]
    assert s.json == "-" and s.checkpoint("llama3-8b") == Path("/w/llama3-8b-4L")
    s = _settings("--gguf", "qwen3-0.6b=/q.gguf", "--gguf", "llama3-8b=/l.gguf", "--json", "o")
    assert s.ggufs == {"qwen3-0.6b": "/q.gguf", "llama3-8b": "/l.gguf"} and s.json == "o"


@pytest.mark.parametrize(
    ("argv", "param"),
    [
        (["--shapes", "llama3-8b,gpt5"], "shapes"),
        (["--layers", "0"], "layers"),
        (["--peers", "vllm"], "peers"),
        (["--gguf", "/m.gguf"], "gguf"),  # two shapes: which one?
        (["--batches", "1,x"], "batches"),
        (["--prompts", "0"], "prompts"),
        (["--steps", "1"], "context"),
    ],
)
def test_bad_arguments_name_their_flag(argv, param):
    with pytest.raises(InvalidParameter) as err:
        _settings(*argv)
    assert err.value.param == param


def test_cli_help_and_errors_need_no_gpu():
    run = [sys.executable, "-m", "bench.gpu"]
    done = subprocess.run([*run, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "--llama-bench" in done.stdout
    done = subprocess.run([*run, "--shapes", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "nope" in done.stderr and "Traceback" not in done.stderr


def test_roofline_bytes_and_floors_match_the_8b_figures():
    per_layer = 6144 * 4096 + 4096 * 4096 + 3 * 14336 * 4096
    assert bench_gpu.layer_params(LLAMA_8B) == per_layer
    assert bench_gpu.weight_bytes(LLAMA_8B) == 2 * (32 * per_layer + 128256 * 4096)
    assert bench_gpu.kv_bytes(LLAMA_8B, 1024) == 1024 * 32 * 2 * 1024 * 2
    bw = 4.3e12
    assert bench_gpu.decode_floor_s(LLAMA_8B, 1, 1024, bw) == pytest.approx(3.52e-3, abs=5e-6)
    assert bench_gpu.decode_floor_s(LLAMA_8B, 32, 1024, bw) == pytest.approx(4.49e-3, abs=5e-6)
    # prefill: tensor-core bound at 1024 tokens (about 14.6 TFLOP), bandwidth bound at one
    floor, basis = bench_gpu.prefill_floor_s(LLAMA_8B, 1024, bw, 800e12)
    assert basis == "gemm" and floor == pytest.approx(14.57e12 / 800e12, rel=1e-3)
    assert bench_gpu.prefill_floor_s(LLAMA_8B, 1, bw, 800e12)[1] == "bw"


def test_a_moe_step_reads_the_experts_its_tokens_pick():
    """qwen3-30b-a3b: one token reads its 8 experts of 128 a layer, a long prompt nearly all;
    its arithmetic counts 8 experts a token."""
    moe = ModelConfig(
        architecture="qwen3_moe",
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    )
    attention = (4096 + 2 * 512) * 2048 + 2048 * 4096
    expert = 3 * 768 * 2048
    one = attention + 128 * 2048 + 8 * expert
    assert bench_gpu.layer_params(moe) == pytest.approx(one)
    assert bench_gpu.weight_bytes(moe) == pytest.approx(2 * (48 * one + 151936 * 2048))
    every = 2 * (48 * (attention + 128 * 2048 + 128 * expert) + 151936 * 2048)
    assert bench_gpu.weight_bytes(moe, tokens=4096) == pytest.approx(every, rel=1e-6)
    assert bench_gpu.experts_read(moe, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    flops = bench_gpu.prefill_flops(moe, 1024) - 2 * 4096 * 1024 * 1024 * 48
    assert flops == pytest.approx(2 * 1024 * 48 * one + 2 * 151936 * 2048)


def _results():
    return {
        "ours": {
            "offline_c1_ms": 7.0,
            "decode": {
                "1": {"step_ms": 5.0, "gpu_ms": 4.0, "context": 1030.0},
                "32": {"step_ms": 16.0, "gpu_ms": 8.0, "context": 1030.0},
            },
            "ttft_ms": {"1024": 40.0},
            "ttft_eager_ms": {"1024": 60.0},
        },
        "hf": {"c1_ms": 70.0, "decode": {"1": {"step_ms": 70.0}}, "ttft_ms": {"1024": 80.0}},
        "llamacpp": {"error": "skipped"},
    }


def test_rows_ratios_are_speed_ratios():
    s = _settings("--batches", "1,32", "--prompts", "1024")
    ceilings = {"bandwidth_gb_s": 4300, "gemm_tflop_s": 800}
    rows = bench_gpu.shape_rows("llama3-8b", LLAMA_8B, _results(), ceilings, s)
    by = {r["workload"]: r for r in rows}
    assert list(by) == [
        "c1 decode, offline API",
        "decode batch 1, ~1024 ctx",
        "decode batch 32, ~1024 ctx",
        "TTFT 1024-token prompt",
        "TTFT 1024-token prompt, eager",
    ]
    b1, b32 = by["decode batch 1, ~1024 ctx"], by["decode batch 32, ~1024 ctx"]
    ttft, eager = by["TTFT 1024-token prompt"], by["TTFT 1024-token prompt, eager"]
    assert b1["unit"] == "ms/token" and b1["ours"] == 5.0 and b1["ours_gpu"] == 4.0
    assert b1["ours_over_peer"] == {"hf": 14.0, "llamacpp": None}  # 70 ms against 5 ms
    assert b32["unit"] == "tok/s" and b32["ours"] == 2000.0 and b32["ours_gpu"] == 4000.0
    floor_ms = 1e3 * bench_gpu.decode_floor_s(LLAMA_8B, 32, 1030.0, 4.3e12)
    assert b32["floor"] == pytest.approx(32e3 / floor_ms)
    assert b32["ours_over_floor"] == pytest.approx(floor_ms / 16.0)  # share of the roofline
    assert 0 < b32["ours_over_floor"] < 1 and b32["peers"] == {"hf": None, "llamacpp": None}
    assert ttft["ours_over_peer"]["hf"] == 2.0 and ttft["floor_basis"] == "gemm"
    assert eager["ours"] == 60.0 and eager["floor"] == ttft["floor"] and eager["peers"] == {}


def test_table_has_a_column_per_peer_and_dashes_for_gaps():
    s = _settings("--batches", "1,32", "--prompts", "1024")
    ceilings = {"bandwidth_gb_s": 4300, "gemm_tflop_s": 800}
    rows = bench_gpu.shape_rows("llama3-8b", LLAMA_8B, _results(), ceilings, s)
    lines = bench_gpu.format_table(rows, s.peers).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == [
        "shape",
        "workload",
        "unit",
        "ours",
        "ours GPU",
        "HF transformers",
        "llama.cpp",
        "floor",
        "ours/floor",
        "ours/HF transformers",
        "ours/llama.cpp",
    ]
    assert len(lines) == 2 + len(rows)
    b32 = [c.strip() for c in lines[4].strip("|").split("|")]
    assert b32[:5] == ["llama3-8b", "decode batch 32, ~1024 ctx", "tok/s", "2,000", "4,000"]
    assert b32[5] == b32[6] == b32[-1] == b32[-2] == "-"
    assert b32[7].endswith("(bw)")
    assert bench_gpu.format_table(rows, []).splitlines()[0].count("|") == 8  # 7 columns


LLAMA_BENCH_JSON = """[
  {"model_type": "llama 8B F16", "n_prompt": 1024, "n_gen": 0, "avg_ns": 44000000,
   "avg_ts": 23272.7},
  {"model_type": "llama 8B F16", "n_prompt": 0, "n_gen": 128, "avg_ns": 614400000,
   "avg_ts": 208.3}
]"""

BATCHED_BENCH = """main: n_kv_max = 74240, n_batch = 2048, n_ubatch = 512, flash_attn = 0
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|  1024 |    128 |    1 |   1152 |    0.045 | 22755.56 |    0.640 |   200.00 |    0.685 |  1681.75 |
|  1024 |    128 |   32 |  36864 |    1.500 | 21845.33 |    1.065 |  3846.15 |    2.565 | 14371.93 |

llama_perf_context_print:        load time =    1000.00 ms
"""


def test_llama_bench_json_gives_c1_and_prompt_times():
    out = parse_llama_bench("build: 1234\n" + LLAMA_BENCH_JSON)
    assert out["c1_ms"] == pytest.approx(4.8)
    assert out["ttft_ms"] == {"1024": pytest.approx(44.0)}


def test_batched_bench_table_gives_a_step_time_per_batch():
    out = parse_batched_bench(BATCHED_BENCH)
    assert set(out) == {"1", "32"}
    assert out["1"]["step_ms"] == pytest.approx(5.0)
    assert out["32"]["step_ms"] == pytest.approx(1065.0 / 128)
    with pytest.raises(ValueError):
        parse_batched_bench("no table here")


def test_the_llama_cpp_peer_gets_a_gguf_copy_of_the_checkpoint_written_once(tmp_path):
    from vtllm.models.loader import load_model
    from vtllm.models.synthetic import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "tiny-qwen3", "tiny-qwen3", bf16=True)
    gguf = bench_gpu.ensure_gguf(ckpt)
    assert gguf == ckpt / "model-f16.gguf" and not gguf.with_suffix(".partial").exists()
    written = gguf.stat().st_mtime_ns
    assert bench_gpu.ensure_gguf(ckpt) == gguf and gguf.stat().st_mtime_ns == written
    loaded = load_model(gguf)
    assert loaded.config.architecture == "qwen3" and loaded.config.num_layers == 2


def test_the_gemma3_4b_shape_is_gemma_3_4b_text(tmp_path):
    """The synthetic gemma3-4b config reads as Gemma 3 4B's text model does: 34 layers, five of
    six windowed over 1,024 keys with the local rope base, the global ones linearly scaled,
    tied, q/k norm; its tensors carry Gemma's four norms a layer."""
    import json

    from vtllm.models.safetensors_loader import read_config
    from vtllm.models.synthetic import hf_config, tensor_specs

    config = hf_config("gemma3-4b")
    (tmp_path / "config.json").write_text(json.dumps(config))
    c = read_config(tmp_path)
    assert (c.architecture, c.hidden_size, c.num_layers, c.head_dim) == ("gemma3", 2560, 34, 256)
    assert c.sliding_window == 1024 and c.rope_local_theta == 10000.0
    assert c.sliding_layers == tuple(i % 6 != 5 for i in range(34))
    assert c.rope_scaling == {"rope_type": "linear", "factor": 8.0} and c.tie_word_embeddings
    assert c.qk_norm and c.query_pre_attn_scalar == 256
    names = {name for name, _, _ in tensor_specs(config)}
    assert "model.layers.0.pre_feedforward_layernorm.weight" in names
    assert "lm_head.weight" not in names
