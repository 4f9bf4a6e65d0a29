"""`python -m bench.gpu`: GPU speed against the card's limits and the peers, in one run.

From the repository root, on a machine with an NVIDIA GPU and the [cuda] extra (torch for the
card's ceilings; HF transformers for the hf peer; loadtest/peers/requirements-hf.txt):
    python -m bench.gpu [--shapes qwen3-0.6b,llama3-8b] [--peers hf,llamacpp]
        [--llama-bench PATH] [--json [PATH]] ...
bench/gpu.sh builds the llama.cpp peer first and runs the whole comparison.

For each shape: a synthetic bf16 checkpoint (written once under --work), our decode step at
several batch sizes, our time to first token, the same workloads through HF transformers and
llama.cpp, and the roofline floor of each row from the bandwidth and tensor-core rate measured
on this card in this run. The last thing printed is one table of all of it.

qwen3-30b-a3b (Qwen3-MoE: 128 experts, 8 a token) is a shape too, not a default: its bf16
checkpoint is about 61 GB, so on a 64 GB disk run it with --layers (e.g. 12). Its floors count
the experts a step's tokens pick (layer_params), not every expert. gemma3-4b (Gemma 3 4B's text
model: windowed layers, GeGLU, tied head over 262k tokens) is a shape too, not a default.

Ratios are speed ratios, so bigger is better for us whatever the unit: ours/floor is the share
of the roofline reached (1.0 = at the physical limit), ours/peer above 1.0 means we are faster.

This module stays importable without a GPU (argument parsing, roofline arithmetic, the table);
the device work lives in bench.gpu_ours (numba.cuda) and bench.gpu_peers (torch, llama.cpp).
"""

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_SHAPES = "qwen3-0.6b,llama3-8b"
PEERS = ("hf", "llamacpp")
PEER_LABELS = {"hf": "HF transformers", "llamacpp": "llama.cpp"}
OFFLINE_PROMPT, OFFLINE_DECODE = 16, 128  # the c1 end-to-end run (as `bench latency` does)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu",
        description="GPU speed against the roofline and the peers (HF transformers, llama.cpp)",
    )
    add_arguments(parser)
    return parser


def add_arguments(parser) -> None:
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="synthetic shapes to measure")
    parser.add_argument(
        "--layers", type=int, help="fewer layers than the shape has (quick runs; reported as is)"
    )
    parser.add_argument("--work", default="/tmp/vtllm-bench-gpu", help="checkpoints live here")
    parser.add_argument("--peers", default="hf,llamacpp", help="hf, llamacpp, or none")
    parser.add_argument("--llama-bench", help="llama-bench binary (llama-batched-bench beside it)")
    parser.add_argument(
        "--gguf",
        action="append",
        default=[],
        help="SHAPE=PATH: llama.cpp's GGUF of that shape (plain PATH with one shape; default: "
        "an F16 copy of our checkpoint, written beside it)",
    )
    parser.add_argument("--batches", default="1,8,32,64", help="decode batch sizes")
    parser.add_argument("--context", type=int, default=1024, help="decode context, tokens")
    parser.add_argument("--prompts", default="128,1024,4096", help="TTFT prompt lengths")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per batch")
    parser.add_argument("--kernels", action="store_true", help="also the kernel micro-benchmarks")
    parser.add_argument(
        "--kv-cache-dtype",
        default="bfloat16",
        choices=("float32", "bfloat16"),
        help="our KV cache storage (bfloat16: the default configuration on cuda)",
    )
    parser.add_argument(
        "--matmul-input-dtype",
        default="bfloat16",
        choices=("float32", "bfloat16"),
        help="activations entering our bf16 matmuls (bfloat16: the default configuration on cuda)",
    )
    parser.add_argument(
        "--pdl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our graphs' kernels launch as the one before exits (VT_CUDA_PDL; on: the default "
        "configuration)",
    )
    parser.add_argument(
        "--flash-prefill",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="our prompt rows attend on tensor cores (VT_CUDA_FLASH_PREFILL; off: the default "
        "configuration)",
    )
    parser.add_argument(
        "--prefill-gemm",
        default="mma",
        choices=("mma", "wgmma"),
        help="our long steps' matmul kernel (VT_CUDA_PREFILL_GEMM; mma: the default configuration)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        help="JSON to stdout instead of the table, or to PATH (rewritten after each shape)",
    )


class Settings:
    """The parsed and checked arguments."""

    def __init__(self, args):
        from vtllm.errors import InvalidParameter
        from vtllm.models.synthetic import SHAPES

        self.shapes = _names(args.shapes)
        for shape in self.shapes:
            if shape not in SHAPES:
                raise InvalidParameter(f"--shapes: unknown shape {shape!r}", param="shapes")
        if args.layers is not None and args.layers < 1:
            raise InvalidParameter(
                f"--layers must be at least 1, got {args.layers}", param="layers"
            )
        self.layers = args.layers
        self.work = Path(args.work)
        self.peers = [p for p in _names(args.peers) if p != "none"]
        for peer in self.peers:
            if peer not in PEERS:
                raise InvalidParameter(f"--peers: unknown peer {peer!r}", param="peers")
        self.llama_bench = args.llama_bench
        self.ggufs = _gguf_map(args.gguf, self.shapes)
        self.batches = _ints(args.batches, "batches")
        self.prompts = _ints(args.prompts, "prompts")
        self.context = args.context
        self.steps = args.steps
        if self.context < 16 or self.steps < 2:
            raise InvalidParameter("--context must be >= 16 and --steps >= 2", param="context")
        self.kernels = args.kernels
        # our runner's knobs, passed as they are to LLM and CudaModelRunner
        self.knobs = {
            "kv_cache_dtype": args.kv_cache_dtype,
            "matmul_input_dtype": args.matmul_input_dtype,
            "cuda_pdl": args.pdl,
            "cuda_flash_prefill": args.flash_prefill,
            "cuda_prefill_gemm": args.prefill_gemm,
        }
        self.json = args.json

    def checkpoint(self, shape: str) -> Path:
        return self.work / (shape if self.layers is None else f"{shape}-{self.layers}L")


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str, what: str) -> list[int]:
    from vtllm.errors import InvalidParameter

    try:
        values = [int(t) for t in _names(text)]
    except ValueError:
        raise InvalidParameter(f"--{what}: expected integers, got {text!r}", param=what) from None
    if not values or min(values) < 1:
        raise InvalidParameter(f"--{what}: expected positive integers, got {text!r}", param=what)
    return values


def _gguf_map(entries: list[str], shapes: list[str]) -> dict[str, str]:
    from vtllm.errors import InvalidParameter

    out = {}
    for entry in entries:
        shape, sep, path = entry.partition("=")
        if not sep:
            if len(shapes) != 1:
                raise InvalidParameter("--gguf needs SHAPE=PATH with several shapes", param="gguf")
            shape, path = shapes[0], entry
        out[shape] = path
    return out


# -- the roofline ----------------------------------------------------------------------------
# Counted for bf16 weights and a bf16 KV cache: the floor of the workload, not of our storage
# choices (our KV cache is float32, which reads twice the KV bytes; that cost shows as a lower
# fraction of the floor). Norm vectors and the embedding rows read per step are left out:
# under 0.1% of the bytes at these shapes.


def experts_read(c, tokens: int) -> float:
    """Experts a routed layer reads in a step of `tokens` tokens, each token's k of E drawn
    uniformly (random weights route near uniformly): E (1 - (1 - k / E)^tokens)."""
    e, k = c.num_experts, c.num_experts_per_tok
    return e * (1.0 - (1.0 - k / e) ** tokens)


def layer_params(c, tokens: int = 1, layer: int = 0) -> float:
    """Weights of one layer's matrix products (q/k/v, o, gate/up, down) that a step of `tokens`
    tokens reads; a routed layer: the router and the experts its tokens pick (one token: k),
    so tokens=1 also counts each token's share of a prefill's arithmetic."""
    qkv = (c.q_size + 2 * c.kv_size) * c.hidden_size
    attention = qkv + c.hidden_size * c.q_size
    if c.num_experts and c.is_moe_layer(layer):
        expert = 3 * c.moe_intermediate_size * c.hidden_size
        return attention + c.num_experts * c.hidden_size + experts_read(c, tokens) * expert
    return attention + 3 * c.intermediate_size * c.hidden_size


def weight_bytes(c, itemsize: int = 2, tokens: int = 1) -> float:
    """Bytes a step of `tokens` tokens reads of weights: every layer's matrices (routed
    layers: the experts its tokens pick), then the output head (read whole even when tied to
    the embedding)."""
    layers = sum(layer_params(c, tokens, i) for i in range(c.num_layers))
    return itemsize * (layers + c.vocab_size * c.hidden_size)


def kv_bytes(c, tokens: float, itemsize: int = 2) -> float:
    """Bytes of K and V over all layers for `tokens` cached tokens."""
    return tokens * c.num_layers * 2 * c.kv_size * itemsize


def decode_floor_s(c, batch: int, context: float, bandwidth: float) -> float:
    """One decode step of `batch` rows at `context` tokens each: weights once, every row's KV."""
    return (weight_bytes(c, tokens=batch) + kv_bytes(c, batch * context)) / bandwidth


def prefill_flops(c, n: int) -> float:
    """A prompt of n tokens: the matrix products, causal attention (QK^T and PV over half the
    n x n square), and the head for the one row that is sampled."""
    attention = 2 * c.q_size * n * n * c.num_layers
    per_token = sum(layer_params(c, 1, i) for i in range(c.num_layers))
    return 2 * n * per_token + attention + 2 * c.vocab_size * c.hidden_size


def prefill_floor_s(c, n: int, bandwidth: float, flops: float) -> tuple[float, str]:
    """(floor, what bounds it): the weights streamed once, or the tensor-core arithmetic."""
    by_bytes, by_flops = weight_bytes(c, tokens=n) / bandwidth, prefill_flops(c, n) / flops
    return (by_flops, "gemm") if by_flops > by_bytes else (by_bytes, "bw")


# -- rows and the table ----------------------------------------------------------------------


def speed_ratio(ours, other, unit: str):
    """ours against other as a speed ratio (bigger: ours is faster), or None."""
    if not ours or not other:
        return None
    return ours / other if unit == "tok/s" else other / ours


def _decode_value(step_ms, batch: int, unit: str):
    if step_ms is None:
        return None
    return step_ms if unit == "ms/token" else 1e3 * batch / step_ms


def shape_rows(label: str, c, results: dict, ceilings: dict, settings) -> list[dict]:
    """The table's rows for one shape from its measurements (see measure_shape's layout)."""
    bw, flops = 1e9 * ceilings["bandwidth_gb_s"], 1e12 * ceilings["gemm_tflop_s"]
    ours, peers = results.get("ours", {}), {p: results.get(p, {}) for p in settings.peers}
    rows = []

    def row(workload, unit, ours_value, ours_gpu, peer_values, floor, basis):
        rows.append(
            {
                "shape": label,
                "workload": workload,
                "unit": unit,
                "ours": ours_value,
                "ours_gpu": ours_gpu,
                "peers": peer_values,
                "floor": floor,
                "floor_basis": basis,
            }
        )

    c1_ctx = OFFLINE_PROMPT + OFFLINE_DECODE / 2
    row(
        "c1 decode, offline API",
        "ms/token",
        ours.get("offline_c1_ms"),
        None,
        {p: r.get("c1_ms") for p, r in peers.items()},
        1e3 * decode_floor_s(c, 1, c1_ctx, bw),
        "bw",
    )
    for batch in settings.batches:
        unit = "ms/token" if batch == 1 else "tok/s"
        step = ours.get("decode", {}).get(str(batch), {})
        ctx = step.get("context", settings.context)
        row(
            f"decode batch {batch}, ~{settings.context} ctx",
            unit,
            _decode_value(step.get("step_ms"), batch, unit),
            _decode_value(step.get("gpu_ms"), batch, unit),
            {
                p: _decode_value(
                    r.get("decode", {}).get(str(batch), {}).get("step_ms"), batch, unit
                )
                for p, r in peers.items()
            },
            _decode_value(1e3 * decode_floor_s(c, batch, ctx, bw), batch, unit),
            "bw",
        )
    for n in settings.prompts:
        floor, basis = prefill_floor_s(c, n, bw, flops)
        row(
            f"TTFT {n}-token prompt",
            "ms",
            ours.get("ttft_ms", {}).get(str(n)),
            None,
            {p: r.get("ttft_ms", {}).get(str(n)) for p, r in peers.items()},
            1e3 * floor,
            basis,
        )
        eager = ours.get("ttft_eager_ms", {}).get(str(n))
        if eager is not None:  # what the step's graph buys, same run
            row(f"TTFT {n}-token prompt, eager", "ms", eager, None, {}, 1e3 * floor, basis)
    for r in rows:
        r["ours_over_floor"] = speed_ratio(r["ours"], r["floor"], r["unit"])
        r["ours_over_peer"] = {
            p: speed_ratio(r["ours"], v, r["unit"]) for p, v in r["peers"].items()
        }
    return rows


def fmt(value, ratio: bool = False) -> str:
    if value is None:
        return "-"
    if ratio:
        return f"{value:.2f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def format_table(rows: list[dict], peers: list[str]) -> str:
    """A markdown table: one row per shape and workload, peers in the order given."""
    names = [PEER_LABELS[p] for p in peers]
    head = ["shape", "workload", "unit", "ours", "ours GPU", *names, "floor", "ours/floor"]
    head += [f"ours/{n}" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], r["workload"], r["unit"], fmt(r["ours"]), fmt(r["ours_gpu"])]
        cells += [fmt(r["peers"].get(p)) for p in peers]
        cells += [f"{fmt(r['floor'])} ({r['floor_basis']})", fmt(r["ours_over_floor"], True)]
        cells += [fmt(r["ours_over_peer"].get(p), True) for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


LEGEND = (
    "ours: our runner at depth 2, wall time with the host in it; ours GPU: the decode step's "
    "CUDA graph replayed back to back (GPU only). floor: the roofline for bf16 weights and "
    "bf16 KV at the measured bandwidth (bw) or bf16 tensor-core rate (gemm). Ratios are speed "
    "ratios: ours/floor is the share of the roofline reached, ours/peer > 1 means faster."
)


# -- the run ---------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"[bench.gpu {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_checkpoint(settings, shape: str) -> Path:
    from vtllm.models.synthetic import write_checkpoint

    out = settings.checkpoint(shape)
    config = out / "config.json"
    if config.exists() and (
        settings.layers is None
        or json.loads(config.read_text())["num_hidden_layers"] == settings.layers
    ):
        return out
    say(f"writing the synthetic checkpoint {out} (the full 8B shape takes a few minutes)")
    write_checkpoint(out, shape, bf16=True, max_position_embeddings=8192, layers=settings.layers)
    return out


def measure_shape(settings, shape: str, ckpt: Path) -> tuple[object, dict]:
    """(model config, {"ours": ..., peer: ...}); a peer that fails leaves {"error": ...}."""
    from bench import gpu_ours, gpu_peers
    from vtllm.models.loader import load_model

    loaded = load_model(ckpt)
    results = {}
    say(f"{shape}: ours, offline API c1")
    c1 = gpu_ours.offline_c1_ms(loaded, knobs=settings.knobs)
    results["ours"] = {"offline_c1_ms": c1, **settings.knobs}
    say(f"{shape}: ours, runner decode at batches {settings.batches} and TTFT {settings.prompts}")
    results["ours"].update(gpu_ours.runner_figures(loaded, settings))
    if "hf" in settings.peers:
        say(f"{shape}: HF transformers")
        results["hf"] = _guarded(gpu_peers.hf_figures, ckpt, settings)
    if "llamacpp" in settings.peers:
        if settings.llama_bench:
            gguf = settings.ggufs.get(shape) or ensure_gguf(ckpt)
            say(f"{shape}: llama.cpp on {gguf}")
            results["llamacpp"] = _guarded(
                gpu_peers.llamacpp_figures, settings.llama_bench, str(gguf), settings
            )
        else:
            results["llamacpp"] = {"error": "skipped: needs --llama-bench"}
    return loaded.config, results


def ensure_gguf(ckpt: Path) -> Path:
    """The checkpoint's GGUF copy (F16) for llama.cpp, written once beside its weights."""
    from vtllm.models.gguf_writer import COPY_NAME, write_gguf

    out = ckpt / COPY_NAME
    if not out.exists() or out.stat().st_mtime < (ckpt / "model.safetensors").stat().st_mtime:
        say(f"writing {out} for llama.cpp (the full 8B shape takes a few minutes)")
        partial = out.with_suffix(".partial")
        write_gguf(ckpt, partial)
        partial.rename(out)
    return out


def _guarded(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # a peer that cannot run is reported, not fatal
        say(f"  failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_bench_gpu(args) -> int:
    import warnings

    settings = Settings(args)
    from numba.core.errors import NumbaPerformanceWarning

    from bench import gpu_peers

    warnings.simplefilter("ignore", NumbaPerformanceWarning)  # low-occupancy notes on small grids
    say("card ceilings: streaming bandwidth and bf16 GEMM rate")
    report = {"machine": gpu_peers.machine(), "ceilings": gpu_peers.card_ceilings()}
    report.update({"settings": vars(args), "shapes": {}, "rows": [], "legend": LEGEND})
    say(f"ceilings: {report['ceilings']}")
    for shape in settings.shapes:
        ckpt = ensure_checkpoint(settings, shape)
        label = shape if settings.layers is None else f"{shape} ({settings.layers} layers)"
        config, results = measure_shape(settings, shape, ckpt)
        report["shapes"][shape] = {"checkpoint": str(ckpt), **results}
        report["rows"] += shape_rows(label, config, results, report["ceilings"], settings)
        _write_json(report, settings.json, final=False)
    if settings.kernels:
        say("kernel micro-benchmarks")
        report["kernels"] = gpu_peers.kernel_tools(
            [settings.checkpoint(s) for s in settings.shapes], settings
        )
    if settings.json == "-":
        _write_json(report, "-", final=True)
        return 0
    _write_json(report, settings.json, final=True)
    for name, text in report.get("kernels", {}).items():
        print(f"== {name}\n{text}")
    for shape, results in report["shapes"].items():
        for peer, figures in results.items():
            if isinstance(figures, dict) and "error" in figures:
                print(f"note: {shape} {peer}: {figures['error']}")
    d = settings.knobs
    pdl = "on" if d["cuda_pdl"] else "off"
    flash = "on" if d["cuda_flash_prefill"] else "off"
    print(
        f"{LEGEND} Our KV cache: {d['kv_cache_dtype']}; matmul inputs: "
        f"{d['matmul_input_dtype']}; programmatic launch: {pdl}; "
        f"flash prefill: {flash}; prefill GEMM: {d['cuda_prefill_gemm']}."
    )
    print(format_table(report["rows"], settings.peers))
    return 0


def _write_json(report: dict, where: str | None, *, final: bool) -> None:
    if where is None or (where == "-" and not final):
        return
    text = json.dumps(report, indent=1, default=str)
    if where == "-":
        print(text)
    else:
        Path(where).write_text(text + "\n")


def main(argv=None) -> int:
    """User errors (a bad flag value) print one line and exit with code 2, as vtllm's do."""
    from vtllm.errors import VtllmError

    args = build_parser().parse_args(argv)
    try:
        return run_bench_gpu(args)
    except VtllmError as exc:
        print(f"bench.gpu: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
