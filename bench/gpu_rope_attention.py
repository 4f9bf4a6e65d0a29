"""rope_attention against the two kernels it replaces (qkv_rope, then the split attention),
from the repo root, on a machine with an NVIDIA GPU and the [cuda] extra:
    python -m bench.gpu_rope_attention [--shape 0.6B] [--cases 1x128,1x1024,8x128]
Each case is batch x context, one new token per sequence. Besides the full kernel, it times
rope_attention without the q/k norms and with positions outside the rope table (no rotation),
so the cost of each part shows. Each figure is a CUDA graph of 20 back-to-back launches
replayed 5 times, median per launch (bench.gpu_profile_decode.gpu_us)."""

import argparse

import numpy as np
from numba import cuda

from bench.gpu_profile_decode import gpu_us
from vtllm.kernels.cuda import paged_attention
from vtllm.kernels.cuda.attention import make_scratch, qkv_rope, rope_attention

SHAPES = {"0.6B": (16, 8, 128), "8B": (32, 8, 128), "135M": (9, 3, 64)}  # (Hq, Hk, D)
BS, MAX_POS = 16, 4096


def time_case(shape: str, B: int, ctx: int, rng, s) -> None:
    hq, hk, d = SHAPES[shape]
    per = -(-ctx // BS)
    blocks = B * per + 1
    kc = cuda.to_device(rng.standard_normal((blocks, BS, hk, d)).astype(np.float32))
    vc = cuda.to_device(rng.standard_normal((blocks, BS, hk, d)).astype(np.float32))
    tables = (1 + rng.permutation(B * per)).reshape(B, per).astype(np.int32)
    slots = np.array([tables[b, (ctx - 1) // BS] * BS + (ctx - 1) % BS for b in range(B)], np.int32)
    meta = [
        cuda.to_device(a)
        for a in (tables, np.full(B, ctx, np.int32), np.arange(B + 1, dtype=np.int32))
    ]
    qkv = cuda.to_device(rng.standard_normal((B, (hq + 2 * hk) * d)).astype(np.float32))
    q, out = cuda.device_array((B, hq, d), np.float32), cuda.device_array((B, hq, d), np.float32)
    cos_sin = cuda.to_device(rng.uniform(-1, 1, (MAX_POS, d)).astype(np.float32))
    norms = {
        "q_norm": cuda.to_device(np.ones(d, np.float32)),
        "k_norm": cuda.to_device(np.ones(d, np.float32)),
    }
    pos, no_pos = (
        cuda.to_device(np.full(B, ctx - 1, np.int32)),
        cuda.to_device(np.full(B, -1, np.int32)),
    )
    sl, scratch = cuda.to_device(slots), make_scratch(B, hq, d, MAX_POS)

    def fused(positions, **kw):
        return lambda: rope_attention(
            qkv, kc, vc, sl, positions, cos_sin, 1e-6, *meta, 0.1, out, scratch, stream=s, **kw
        )

    rows = {
        "split attention alone": lambda: paged_attention(
            q, kc, vc, *meta, 0.1, out, scratch=scratch, stream=s
        ),
        "qkv_rope alone": lambda: qkv_rope(
            qkv, q, kc, vc, sl, pos, cos_sin, 1e-6, stream=s, **norms
        ),
        "rope_attention": fused(pos, **norms),
        "  without norms": fused(pos),
        "  without rotation": fused(no_pos, **norms),
        "  without either": fused(no_pos),
    }
    for name, fn in rows.items():
        print(f"{shape} b{B} ctx {ctx:5d}  {name:22s} {gpu_us(s, fn):7.2f} us")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="0.6B", choices=sorted(SHAPES))
    p.add_argument("--cases", default="1x128,1x1024,8x128", help="batch x context, comma separated")
    args = p.parse_args()
    s, rng = cuda.stream(), np.random.default_rng(0)
    for case in args.cases.split(","):
        B, ctx = (int(v) for v in case.split("x"))
        time_case(args.shape, B, ctx, rng, s)


if __name__ == "__main__":
    main()
