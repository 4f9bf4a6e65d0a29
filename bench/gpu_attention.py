"""Decode attention over the paged KV cache, from the repo root, on a machine with an NVIDIA
GPU and the [cuda] extra (and torch):
    python -m bench.gpu_attention [--variant FILE ...] [--targets 1024,4096] [--kv bfloat16]
Times _attention_split (the decode path: split keys over blocks, partial states to a scratch,
then the in-order combine) at model shapes, batch sizes and context lengths, against torch's
scaled_dot_product_attention on the same float32 K/V laid out contiguously (the peer: no
paging, no GQA sharing of loads). GB/s counts the K and V bytes once per launch; the H200
streams ~4.3 TB/s. Each figure is a CUDA graph of 20 launches replayed 5 times, median per
launch, over enough copies of the KV cache that it comes from HBM (not L2). --variant times
other copies of _attention_split.py too (checked against ours), or any module with its entry
point (decode_attention): --variant vtllm/kernels/cuda/_attention_ring.py times the ring
kernel. --kv bfloat16: a cache of bf16 bits (2 bytes a value) and torch's K/V and q in bf16.
--shapes 8B: only that shape. --cases 8B:8:1024,8B:16:1024 times those (shape:batch:context)
cases instead of CASES. --geometries 4:3:168,2:3:128 sweeps a ring module's (warps, stages,
registers) for the cache type in use, without copies of the module.
    python -m bench.gpu_attention --prefill 512,1024,4096 [--variant FILE ...]
times the prefill path instead (one prompt of n tokens attending causally to itself, no
scratch; --kv as above) against torch's causal scaled_dot_product_attention; a variant may be
a copy of _attention_prefill.py (its prefill_attention; ours is attention.paged_attention
without scratch) or of _attention_flash.py (tensor cores; needs --kv bfloat16; its max err is
rounding, not a bug). Each case launches its kernel once outside a graph before timing, so a
profiler can take that launch: ncu --kernel-name regex:_prefill_kernel --launch-count 1
--section SpeedOfLight --section WarpStateStats python -m bench.gpu_attention --prefill 1024
--shapes 8B
    --window N: every case through a sliding window of N keys (Gemma 3's local layers: 1024;
a window no shorter than the context times the masked kernels on the global layers' work);
--general adds the general kernel (_attention_paged, split=False) as a row of its own: what
windowed, soft-capped or 256-dim layers ran before the exact family took them. The Gemma 3 4B
case (8 query heads over 4 kv heads of 256 dims):
    python -m bench.gpu_attention --kv bfloat16 --shapes gemma3-4b --general [--window 1024]
    python -m bench.gpu_attention --kv bfloat16 --shapes gemma3-4b --general --prefill 1024 \
        [--window 1024]"""

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import torch
from numba import cuda

from bench.gpu_linear import numba_us, torch_us
from vtllm.kernels.cuda import _attention_paged as attention_paged
from vtllm.kernels.cuda import _attention_split as attention_split
from vtllm.kernels.cuda.attention import make_scratch, paged_attention
from vtllm.models.synthetic import to_bf16_bits

TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# name: (query heads, kv heads, head dim)
SHAPES = {
    "0.6B": (16, 8, 128),
    "8B": (32, 8, 128),
    "135M": (9, 3, 64),
    "gemma3-4b": (8, 4, 256),
}
CASES = [  # (shape, batch, context)
    ("135M", 1, 512),
    ("0.6B", 1, 512),
    ("0.6B", 1, 4096),
    ("0.6B", 32, 512),
    ("8B", 1, 1024),
    ("8B", 32, 512),
    ("8B", 32, 1024),
    ("8B", 64, 1024),
    ("gemma3-4b", 1, 1024),
    ("gemma3-4b", 1, 4096),
    ("gemma3-4b", 32, 1024),
]
BS = 16
L2_FLUSH_BYTES = 256 << 20  # KV bytes cycled through per case


class General:
    """The general kernel under the entry points the bench calls (no scratch, no splits)."""

    TARGET_BLOCKS = 0  # (not used)

    @staticmethod
    def decode_attention(q, k, v, *meta_scale_out, scratch, window=0, stream=0):
        attention_paged.general_attention(q, k, v, *meta_scale_out, window=window, stream=stream)

    @staticmethod
    def prefill_attention(q, k, v, *meta_scale_out, window=0, stream=0):
        attention_paged.general_attention(q, k, v, *meta_scale_out, window=window, stream=stream)


def load(path):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case_arrays(rng, hq, hk, d, batch, ctx, kv="float32"):
    """Inputs for one case; K and V come in enough copies (same values, other addresses) that
    the graph's back-to-back launches cycle through more than L2 holds (H200: 60 MB), so every
    launch reads its KV from HBM as a real decode step does."""
    per = -(-ctx // BS)
    blocks = batch * per + 1
    shape = (blocks, BS, hk, d)
    itemsize = 2 if kv == "bfloat16" else 4
    copies = max(1, min(20, -(-L2_FLUSH_BYTES // (2 * itemsize * int(np.prod(shape))))))

    def cache():
        values = rng.standard_normal(shape).astype(np.float32)
        return cuda.to_device(to_bf16_bits(values) if kv == "bfloat16" else values)

    kcs, vcs = [], []
    for _ in range(copies):
        kcs.append(cache())
        vcs.append(cache())
    tables = (1 + rng.permutation(batch * per)).reshape(batch, per).astype(np.int32)
    seq_lens = np.full(batch, ctx, np.int32)
    qsl = np.arange(batch + 1, dtype=np.int32)
    q = rng.standard_normal((batch, hq, d)).astype(np.float32)
    meta = (cuda.to_device(tables), cuda.to_device(seq_lens), cuda.to_device(qsl))
    return kcs, vcs, meta, cuda.to_device(q)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", default=[])
    p.add_argument(
        "--targets", default="", help="TARGET_BLOCKS values to try (default: the module's)"
    )
    p.add_argument(
        "--geometries",
        default="",
        help="WARPS:STAGES:REGISTERS,...: for a module with GEOMETRY (attention_ring), each in "
        "turn for the cache type in use (default: the module's)",
    )
    p.add_argument("--prefill", default="", help="prompt lengths: time the prefill path")
    p.add_argument("--kv", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--shapes", default=",".join(SHAPES), help="which of " + ", ".join(SHAPES))
    p.add_argument("--cases", default="", help="shape:batch:context,... instead of CASES")
    p.add_argument("--window", type=int, default=0, help="a sliding window of this many keys")
    p.add_argument("--general", action="store_true", help="time the general kernel too")
    args = p.parse_args()
    shapes = args.shapes.split(",")
    mods = [("ours", attention_split)] + [(Path(v).stem, load(v)) for v in args.variant]
    mods += [("general", General)] if args.general else []
    if args.prefill:
        lengths = [int(n) for n in args.prefill.split(",")]
        return bench_prefill(mods, lengths, shapes, args.kv, args.window)
    targets = [int(t) for t in args.targets.split(",") if t]
    geometries = [tuple(int(x) for x in g.split(":")) for g in args.geometries.split(",") if g]
    cache_type = np.uint16 if args.kv == "bfloat16" else np.float32
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'kernel':22s} {'shape':9s} {'batch':>5s} {'ctx':>5s} {'us':>8s} "
        f"{'GB/s':>6s} {'torch us':>8s} {'GB/s':>6s} {'max err':>8s}"
        + (f"  (window {args.window}: GB/s counts the window's keys)" if args.window else "")
    )
    cases = [(c.split(":")[0], *map(int, c.split(":")[1:])) for c in args.cases.split(",") if c]
    for shape, batch, ctx in [c for c in cases or CASES if c[0] in shapes]:
        hq, hk, d = SHAPES[shape]
        kcs, vcs, meta, q = case_arrays(rng, hq, hk, d, batch, ctx, args.kv)
        bf16 = args.kv == "bfloat16"
        keys = min(ctx, args.window) if args.window else ctx
        gb = batch * keys * hk * d * (2 if bf16 else 4) * 2 / 1e3
        # the peer: contiguous K/V [batch, hk, ctx, d] expanded to the query heads
        dt = torch.bfloat16 if bf16 else torch.float32
        kt = torch.randn(batch, hk, ctx, d, device="cuda", dtype=dt).repeat_interleave(hq // hk, 1)
        vt = torch.randn(batch, hk, ctx, d, device="cuda", dtype=dt).repeat_interleave(hq // hk, 1)
        qt = torch.randn(batch, hq, 1, d, device="cuda", dtype=dt)
        peer = torch_us(
            lambda qt=qt, kt=kt, vt=vt: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
        )
        ref = None
        torch.cuda.empty_cache()
        for name, mod, target, geometry in runs(mods, targets, geometries, cache_type):
            mod.TARGET_BLOCKS = target
            if geometry is not None:
                mod.GEOMETRY[cache_type] = geometry
            scratch = make_scratch(batch, hq, d, 4097)
            out = cuda.device_array((batch, hq, d), np.float32)

            turn = [0]

            def fn(mod=mod, out=out, scratch=scratch, turn=turn, kv=(kcs, vcs, meta, q, d)):
                kcs, vcs, meta, q, d = kv
                i = turn[0] % len(kcs)
                turn[0] += 1
                window = {"window": args.window} if args.window else {}  # (older variants)
                mod.decode_attention(
                    q, kcs[i], vcs[i], *meta, d**-0.5, out, scratch=scratch, **window, stream=stream
                )

            label = f"{name}@{target}" + ("" if geometry is None else f"@{geometry}")
            try:
                us = numba_us(stream, fn)
            except Exception as exc:  # e.g. a geometry past the shared memory an SM has
                print(f"{label:22s} {shape:9s} {batch:5d} {ctx:5d} failed: {exc}"[:200])
                continue
            got = out.copy_to_host()
            ref = got if ref is None else ref
            err = float(np.abs(got - ref).max())
            print(
                f"{label:22s} {shape:9s} {batch:5d} {ctx:5d} {us:8.1f} "
                f"{gb / us:6.0f} {peer:8.1f} {gb / peer:6.0f} {err:8.1e}"
            )
        torch.cuda.empty_cache()


def runs(mods, targets, geometries, cache_type):
    """(name, module, TARGET_BLOCKS, GEOMETRY entry or None) to time, in order."""
    for name, mod in mods:
        sweep = geometries if geometries and hasattr(mod, "GEOMETRY") else [None]
        original = getattr(mod, "GEOMETRY", {}).get(cache_type)
        for geometry in sweep:
            for target in targets or [mod.TARGET_BLOCKS]:
                yield name, mod, target, geometry
        if original is not None:
            mod.GEOMETRY[cache_type] = original


def bench_prefill(mods, lengths, shapes, kv, window=0):
    """One n-token prompt per case, KV already in the cache; TFLOP/s counts q.k and p.v over
    the causal half (4 hq d n^2 / 2 flops; ours with a window: the keys it leaves; the peer
    attends to every key)."""
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'kernel':24s} {'shape':9s} {'n':>5s} {'us':>9s} "
        f"{'TFLOP/s':>8s} {'torch us':>9s} {'TFLOP/s':>8s} {'max err':>8s}"
    )
    for shape in [s for s in SHAPES if s in shapes]:
        hq, hk, d = SHAPES[shape]
        for n in lengths:
            kcs, vcs, _, _ = case_arrays(rng, hq, hk, d, 1, n, kv)
            per = -(-n // BS)
            tables = cuda.to_device((1 + np.arange(per, dtype=np.int32)).reshape(1, per))
            meta = (
                tables,
                cuda.to_device(np.array([n], np.int32)),
                cuda.to_device(np.array([0, n], np.int32)),
            )
            q = cuda.to_device(rng.standard_normal((n, hq, d)).astype(np.float32))
            w = min(window, n) if window else n  # keys a row sees: i + 1, at most w
            tflop = 4 * hq * d * (w * (w + 1) / 2 + (n - w) * w) / 1e6
            peer_tflop = 4 * hq * d * n * n / 2 / 1e6
            qt = torch.randn(1, hq, n, d, device="cuda", dtype=TORCH_DTYPE[kv])
            kt, vt = torch.randn_like(qt), torch.randn_like(qt)
            peer = torch_us(
                lambda qt=qt, kt=kt, vt=vt: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True
                )
            )
            ref = None
            for name, mod in mods:
                out = cuda.device_array((n, hq, d), np.float32)
                turn = [0]

                def fn(mod=mod, out=out, turn=turn, kv=(kcs, vcs, meta, q, d)):
                    kcs, vcs, meta, q, d = kv
                    i = turn[0] % len(kcs)
                    turn[0] += 1
                    args = (q, kcs[i], vcs[i], *meta, d**-0.5, out)
                    masks = {"window": window} if window else {}  # (older variants)
                    if hasattr(mod, "flash_prefill"):
                        mod.flash_prefill(*args, stream=stream)
                    elif hasattr(mod, "prefill_attention"):
                        mod.prefill_attention(*args, **masks, stream=stream)
                    else:
                        paged_attention(*args, **masks, stream=stream)

                us = numba_us(stream, fn, reps=5)
                got = out.copy_to_host()
                ref = got if ref is None else ref
                err = float(np.abs(got - ref).max())
                print(
                    f"{name:24s} {shape:9s} {n:5d} {us:9.1f} {tflop / us:8.2f} "
                    f"{peer:9.1f} {peer_tflop / peer:8.2f} {err:8.1e}"
                )
            del kcs, vcs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
