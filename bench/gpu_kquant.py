"""The K-quant GEMV (kernels/cuda/_linear_kquant) against bf16 on the same matrix shapes, from
the repo root, on a machine with an NVIDIA GPU and the [cuda] extra (torch optional):
    python -m bench.gpu_kquant [--types Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,Q5_0,Q5_1] [--ms 1,8]
        [--shapes '0.6B qkv,8B down'] [--no-torch]
Per type, shape (bench.gpu_linear.SHAPES) and M: us a launch (a CUDA graph of 20 launches
replayed 5 times, median), GB/s counting the weight's bytes once a launch; beside it bf16
through linear_mma (the packed tensor-core GEMV a bf16 model's decode takes) and torch's
bf16 linear (cuBLAS). 'bits' counts the outputs of a row that differ between the row alone
(M = 1) and the same row inside the M-row step: it must be 0 (batch invariance).
"""

import argparse

import numpy as np
from numba import cuda

from bench.gpu_linear import SHAPES, numba_us, torch_us
from vtllm.kernels import QType, block_layout
from vtllm.kernels.cuda import _linear_mma, linear

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


def bits_differ(x, w, qtype, m, stream) -> int:
    """Outputs of row m - 1 that differ between it alone and inside the m-row step."""
    n = w.shape[0]
    many = cuda.device_array((m, n), np.float32, stream=stream)
    one = cuda.device_array((1, n), np.float32, stream=stream)
    linear(x, w, qtype, many, stream=stream)
    linear(x[m - 1 : m], w, qtype, one, stream=stream)
    stream.synchronize()
    a, b = many.copy_to_host()[m - 1], one.copy_to_host()[0]
    return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--types", default=TYPES)
    p.add_argument("--ms", default="1,8")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--no-torch", action="store_true", help="skip the cuBLAS column")
    args = p.parse_args()
    torch = None
    if not args.no_torch:
        import torch
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    ms = [int(m) for m in args.ms.split(",")]
    print(
        f"{'type':5s} {'shape':13s} {'M':>3s} {'us':>8s} {'GB/s':>6s} {'bf16 us':>8s} "
        f"{'GB/s':>6s} {'torch us':>8s} {'q/bf16':>6s} {'bits':>4s}"
    )
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        wb = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        bits16 = (wb.view(np.uint32) >> 16).astype(np.uint16)  # bf16, truncated
        packed = _linear_mma.pack_bf16(cuda.to_device(bits16, stream=stream), stream=stream)
        wt = torch.from_numpy(bits16.view(np.int16)).cuda().view(torch.bfloat16) if torch else None
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(_linear_mma.x_scratch_words(m, k), np.uint32, stream=stream)
            bf16 = numba_us(
                stream,
                lambda x=x, o=out, xs=xs, p=packed: _linear_mma.linear_mma(
                    x, p, o, x_scratch=xs, stream=stream
                ),
            )
            peer = ""
            if torch:
                xt = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                peer = f"{torch_us(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt)):8.1f}"
            for tname in args.types.split(","):
                qtype = QType[tname]
                if k % block_layout(qtype)[0]:
                    continue
                w = cuda.to_device(random_blocks(rng, qtype, n, k), stream=stream)
                us = numba_us(
                    stream, lambda x=x, w=w, o=out, q=qtype: linear(x, w, q, o, stream=stream)
                )
                bad = bits_differ(x, w, qtype, m, stream) if m > 1 else 0
                print(
                    f"{tname:5s} {name:13s} {m:3d} {us:8.1f} {w.nbytes / 1e3 / us:6.0f} "
                    f"{bf16:8.1f} {n * k * 2 / 1e3 / bf16:6.0f} {peer:>8s} {bf16 / us:6.2f} "
                    f"{bad:4d}"
                )
                del w


if __name__ == "__main__":
    main()
