"""K-quant matrices on the GPU: the tensor-core path (codes packed by _kquant_pack, the model's
route at each M through DeviceWeight.matmul: _linear_mma, _linear_rows, _gemm_mma) against the
same shape in bf16 through the same routes, torch's bf16 linear (cuBLAS) and the K-quant GEMV
(_linear_kquant, what unpacked K-quant W takes), from the repo root, on a machine with an NVIDIA
GPU and the [cuda] extra (torch optional):
    python -m bench.gpu_kquant [--types Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,Q5_0,Q5_1]
        [--ms 1,8,32,64,1024] [--shapes '8B gate_up,8B down,8B qkv'] [--x-bf16]
        [--gemv-max-m 64] [--no-torch]
Per type, shape (bench.gpu_linear.SHAPES) and M: us a call (a CUDA graph of 20 calls replayed 5
times, median) of the packed path ('-' for a type or shape that does not pack: Q5_0 / Q5_1), of
bf16, of torch and of the GEMV (above --gemv-max-m tokens not timed: its 4-row loop takes
milliseconds there); GB/s count the packed weight's bytes once a call. 'bits' counts the
outputs of a row that differ between the row alone (M = 1) and the same row inside the M-row
step, on the packed path (the GEMV's without one): it must be 0 (batch invariance).
mma/bf16: the packed path's time over bf16's; gemv/mma: the GEMV's over the packed path's.
"""

import argparse

import numpy as np
from numba import cuda

from bench.gpu_linear import SHAPES, numba_us, torch_us
from vtllm.kernels import QType, block_layout
from vtllm.kernels.cuda import linear
from vtllm.kernels.cuda.matmul import upload_matrix, x_scratch_words

TYPES = "Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,Q5_0,Q5_1"
# byte offsets of each type's f16 block scales: set to a small finite value (random bytes there
# could be inf or NaN; the speed does not depend on the values)
_SCALES = {
    QType.Q2_K: (80, 82),
    QType.Q3_K: (108,),
    QType.Q4_K: (0, 2),
    QType.Q5_K: (0, 2),
    QType.Q6_K: (208,),
    QType.Q5_0: (0,),
    QType.Q5_1: (0, 2),
}


def random_blocks(rng, qtype, n, k) -> np.ndarray:
    per, nbytes = block_layout(qtype)
    w = rng.integers(0, 256, (n, k // per * nbytes), dtype=np.uint8)
    blocks = w.reshape(-1, nbytes)
    for off in _SCALES[qtype]:
        blocks[:, off : off + 2] = np.array([0.001], np.float16).view(np.uint8)
    return w


def bits_differ(x, matmul, n, m, stream) -> int:
    """Outputs of row m - 1 that differ between it alone and inside the m-row step."""
    many = cuda.device_array((m, n), np.float32, stream=stream)
    one = cuda.device_array((1, n), np.float32, stream=stream)
    matmul(x, many)
    matmul(x[m - 1 : m], one)
    stream.synchronize()
    a, b = many.copy_to_host()[m - 1], one.copy_to_host()[0]
    return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))


def _route(weight, xs, stream):
    """matmul(x, out) through the weight's route at x's M (DeviceWeight.matmul)."""
    return lambda x, out: weight.matmul(x, out, x_scratch=xs, stream=stream)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--types", default=TYPES)
    p.add_argument("--ms", default="1,8,32,64,1024")
    p.add_argument("--shapes", default="8B gate_up,8B down,8B qkv")
    p.add_argument("--x-bf16", action="store_true", help="pack with x_bf16 (x rounded to bf16)")
    p.add_argument("--gemv-max-m", type=int, default=64, help="time the GEMV up to this M")
    p.add_argument("--no-torch", action="store_true", help="skip the cuBLAS column")
    args = p.parse_args()
    torch = None
    if not args.no_torch:
        import torch
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    ms = [int(m) for m in args.ms.split(",")]
    print(
        f"{'type':5s} {'shape':13s} {'M':>5s} {'mma us':>8s} {'GB/s':>6s} {'bf16 us':>8s} "
        f"{'torch us':>8s} {'gemv us':>8s} {'mma/bf16':>8s} {'gemv/mma':>8s} {'bits':>4s}"
    )
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        wb = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        bits16 = (wb.view(np.uint32) >> 16).astype(np.uint16)  # bf16, truncated
        bf16 = upload_matrix(bits16, QType.BF16, (n, k), x_bf16=args.x_bf16, stream=stream)
        wt = torch.from_numpy(bits16.view(np.int16)).cuda().view(torch.bfloat16) if torch else None
        weights = {}
        for tname in args.types.split(","):
            qtype = QType[tname]
            if k % block_layout(qtype)[0] == 0:
                rows = random_blocks(rng, qtype, n, k)
                raw = cuda.to_device(rows, stream=stream)
                packed = upload_matrix(
                    rows, qtype, (n, k), x_bf16=args.x_bf16, kquant=True, stream=stream
                )
                weights[tname] = (qtype, raw, packed if packed.packed else None)
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(x_scratch_words(m, k), np.uint32, stream=stream)

            r16 = _route(bf16, xs, stream)
            bf16_us = numba_us(stream, lambda x=x, o=out, r=r16: r(x, o))
            peer = ""
            if torch:
                xt = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                peer = f"{torch_us(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt)):8.1f}"
            for tname, (qtype, raw, packed) in weights.items():
                mma, gbs, ratio, bad = "-", "-", "-", 0
                if packed is not None:
                    r = _route(packed, xs, stream)
                    us = numba_us(stream, lambda x=x, o=out, r=r: r(x, o))
                    nbytes = packed.data.data.nbytes + packed.data.scale.nbytes
                    mma, gbs, ratio = (
                        f"{us:8.1f}",
                        f"{nbytes / 1e3 / us:6.0f}",
                        f"{us / bf16_us:8.2f}",
                    )
                    bad = bits_differ(x, r, n, m, stream) if m > 1 else 0
                gemv, speedup = "-", "-"
                if m <= args.gemv_max_m:
                    g = numba_us(
                        stream, lambda x=x, w=raw, o=out, q=qtype: linear(x, w, q, o, stream=stream)
                    )
                    gemv = f"{g:8.1f}"
                    speedup = f"{g / us:8.2f}" if packed is not None else "-"
                    if packed is None and m > 1:
                        lin = lambda x, o, w=raw, q=qtype: linear(x, w, q, o, stream=stream)  # noqa: E731
                        bad = bits_differ(x, lin, n, m, stream)
                print(
                    f"{tname:5s} {name:13s} {m:5d} {mma:>8s} {gbs:>6s} {bf16_us:8.1f} {peer:>8s} "
                    f"{gemv:>8s} {ratio:>8s} {speedup:>8s} {bad:4d}"
                )


if __name__ == "__main__":
    main()
