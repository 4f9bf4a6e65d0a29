"""Linear kernels against torch on the same shapes, from the repo root, on a machine with an
NVIDIA GPU and the [cuda] extra (and torch):
    python -m bench.gpu_linear [--ms 1,2,4,8,16,32,64] [--prefill 1024] [--variant F] [--rows]
    python -m bench.gpu_linear --gemm [--gemm-ms 128,512,1024,4096] [--shapes ...]
Ours: the tensor-core kernel on packed bf16 W (linear_mma) and the GEMV kernel (linear, bf16
bits); the peer: torch.nn.functional.linear in bf16 (cuBLAS). Every figure is a CUDA graph of
20 back-to-back launches replayed 5 times, median per launch (no Python launch cost in it).
GB/s counts the weight bytes once per launch; TFLOP/s is 2 M N K per launch. --variant loads
the kernel module from a file instead (a copy with other tuning constants; with --gemm, a
copy of _gemm_mma.py; with --wgmma, of _gemm_wgmma.py). --wgmma times gemm_wgmma (Hopper's
warpgroup mma, x rounded included) against gemm_mma, linear_mma's bits and torch. --rows adds
linear_rows (batched decode, bits checked against linear_mma) for M > 8, and --rows-variant
copies of its module beside it. --gemm times the prefill kernel gemm_mma (x split included,
and alone) against linear_mma and torch on the 8B shapes (8B o at M = 4096 is 4096^3), and
checks on the device that its bits are linear_mma's. --x-bf16 packs W for x rounded to bf16
(one mma a product; PackedBF16.x_bf16), ours and the bit reference alike. To see what stalls
the GEMM (Nsight Compute profiles its first launch, the bit check's; kernels made by a factory
carry its name, _gemm_kernel, in their mangled names, while ncu's default matches the plain
name, kernel), prefix the command with
    ncu --kernel-name-base mangled --kernel-name regex:_gemm_kernel --launch-count 1
        --section SpeedOfLight
        --section WarpStateStats --section SchedulerStats --section Occupancy
and run it with --gemm --x-bf16 --gemm-ms 4096 --shapes '8B qkv'.
    python -m bench.gpu_linear --fp8 [--ms 1,8,32,64] [--prefill 1024]
times FP8 weights (e4m3 codes, a scale per row) against bf16 through the model's route."""

import argparse
import importlib.util
import statistics

import numpy as np
import torch
from numba import cuda

from vtllm.executor.cuda_graphs import CudaGraph
from vtllm.kernels import QType
from vtllm.kernels.cuda import _gemm_mma as default_gemm_module
from vtllm.kernels.cuda import _linear_mma as default_module
from vtllm.kernels.cuda import _linear_rows as default_rows_module
from vtllm.kernels.cuda import linear

SHAPES = {  # name: (N, K)
    "8B qkv": (6144, 4096),
    "8B o": (4096, 4096),
    "8B gate_up": (28672, 4096),
    "8B down": (4096, 14336),
    "8B lm_head": (128256, 4096),
    "0.6B qkv": (4096, 1024),
    "0.6B o": (1024, 2048),
    "0.6B gate_up": (6144, 1024),
    "0.6B down": (1024, 3072),
    "0.6B lm_head": (151936, 1024),
}


def numba_us(stream, fn, reps=20, rounds=5) -> float:
    fn()
    stream.synchronize()
    graph = CudaGraph(stream, lambda: [fn() for _ in range(reps)])
    times = []
    for _ in range(rounds):
        a, b = cuda.event(), cuda.event()
        a.record(stream)
        graph.replay()
        b.record(stream)
        b.synchronize()
        times.append(cuda.event_elapsed_time(a, b) * 1e3 / reps)
    graph.close()
    return statistics.median(times)


def torch_us(fn, reps=20, rounds=5) -> float:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                fn()
        times = []
        for _ in range(rounds):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            g.replay()
            b.record(s)
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def bench_gemm(ms, shapes, gmod, x_bf16):
    """gemm_mma (of module gmod) against linear_mma (same split of x) and torch; 'bits' counts
    the outputs whose bits differ from linear_mma's (must be 0)."""
    mod = default_module
    gemm_mma, gemm_pays = gmod.gemm_mma, gmod.gemm_pays
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'shape':14s} {'M':>5s} {'gemm us':>8s} {'TFLOP/s':>7s} "
        f"{'alone us':>8s} {'mma us':>8s} {'TFLOP/s':>7s} {'torch us':>8s} "
        f"{'TFLOP/s':>7s} {'torch/gemm':>10s} {'bits':>6s} {'pays':>5s}"
    )
    for name in shapes:
        n, k = SHAPES[name]
        wt = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        w_bits = cuda.as_cuda_array(wt.view(torch.int16)).view(np.uint16)
        packed = mod.pack_bf16(w_bits, x_bf16=x_bf16, stream=stream)
        bias = cuda.to_device(rng.standard_normal(n).astype(np.float32), stream=stream)
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            ref = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(mod.x_scratch_words(m, k), np.uint32, stream=stream)
            mod.linear_mma(x, packed, ref, bias=bias, x_scratch=xs, stream=stream)
            gemm_mma(
                mod.split_x(x, xs, x_bf16=packed.x_bf16, stream=stream),
                packed,
                out,
                bias=bias,
                stream=stream,
            )
            stream.synchronize()
            bad = int(
                np.count_nonzero(
                    out.copy_to_host().view(np.uint32) != ref.copy_to_host().view(np.uint32)
                )
            )
            xp = mod.split_x(x, xs, x_bf16=packed.x_bf16, stream=stream)

            def split_gemm(x=x, xs=xs, p=packed, o=out):
                gemm_mma(mod.split_x(x, xs, x_bf16=p.x_bf16, stream=stream), p, o, stream=stream)

            ours = numba_us(stream, split_gemm)
            alone = numba_us(
                stream, lambda xp=xp, p=packed, o=out: gemm_mma(xp, p, o, stream=stream)
            )
            mma = numba_us(
                stream,
                lambda x=x, p=packed, o=ref, xs=xs: mod.linear_mma(
                    x, p, o, x_scratch=xs, stream=stream
                ),
            )
            xt = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            peer = torch_us(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt))
            tf = 2 * m * n * k / 1e6
            print(
                f"{name:14s} {m:5d} {ours:8.1f} {tf / ours:7.1f} {alone:8.1f} "
                f"{mma:8.1f} {tf / mma:7.1f} {peer:8.1f} {tf / peer:7.1f} "
                f"{peer / ours:10.2f} {bad:6d} {gemm_pays(m, n)!s:>5s}"
            )
            del x, out, ref, xs
        del packed, wt
        torch.cuda.empty_cache()


def bench_wgmma(ms, shapes, wg):
    """gemm_wgmma (x rounded included) against gemm_mma (x split included), linear_mma and
    torch, W packed with x_bf16; 'bits' counts the outputs whose bits differ from linear_mma's
    (0 for a stand-in), 'err' their largest difference relative to linear_mma's largest
    output (a wrong layout shows as O(1), rounding as ~1e-6)."""
    mod, gm = default_module, default_gemm_module
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'shape':14s} {'M':>5s} {'wgmma us':>8s} {'TFLOP/s':>7s} {'mma us':>8s} "
        f"{'TFLOP/s':>7s} {'torch us':>8s} {'TFLOP/s':>7s} {'wg/torch':>8s} {'bits':>8s} "
        f"{'err':>8s}"
    )
    for name in shapes:
        n, k = SHAPES[name]
        wt = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        w_bits = cuda.as_cuda_array(wt.view(torch.int16)).view(np.uint16)
        packed = mod.pack_bf16(w_bits, x_bf16=True, stream=stream)
        bias = cuda.to_device(rng.standard_normal(n).astype(np.float32), stream=stream)
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            ref = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(mod.x_scratch_words(m, k), np.uint32, stream=stream)
            mod.linear_mma(x, packed, ref, bias=bias, x_scratch=xs, stream=stream)
            wg.gemm_wgmma(wg.round_x(x, xs, stream=stream), packed, out, bias=bias, stream=stream)
            stream.synchronize()
            o, r = out.copy_to_host(), ref.copy_to_host()
            bad = int(np.count_nonzero(o.view(np.uint32) != r.view(np.uint32)))
            err = float(np.nanmax(np.abs(o - r)) / np.abs(r).max())

            def ours_fn(x=x, xs=xs, p=packed, o=out):
                wg.gemm_wgmma(wg.round_x(x, xs, stream=stream), p, o, stream=stream)

            def mma_fn(x=x, xs=xs, p=packed, o=out):
                gm.gemm_mma(mod.split_x(x, xs, x_bf16=True, stream=stream), p, o, stream=stream)

            ours, mma = numba_us(stream, ours_fn), numba_us(stream, mma_fn)
            xt = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            peer = torch_us(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt))
            tf = 2 * m * n * k / 1e6
            print(
                f"{name:14s} {m:5d} {ours:8.1f} {tf / ours:7.1f} {mma:8.1f} {tf / mma:7.1f} "
                f"{peer:8.1f} {tf / peer:7.1f} {peer / ours:8.2f} {bad:8d} {err:8.1e}"
            )
            del x, out, ref, xs
        del packed, wt
        torch.cuda.empty_cache()


def bench_fp8(ms, shapes):
    """FP8 weights (e4m3 codes and a scale per row, FP8_ROWS) against the same shape in bf16,
    both packed with x_bf16 and multiplied through DeviceWeight.matmul (the route the model
    takes at each M: linear_mma, linear_rows or gemm_mma). GB/s counts each one's weight bytes
    (bf16: 2 a weight; FP8: 1, and 4 a row for its scale)."""
    from vtllm.kernels import FP8_ROWS
    from vtllm.kernels.cuda.matmul import upload_matrix

    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'shape':14s} {'M':>5s} {'bf16 us':>8s} {'GB/s':>6s} {'fp8 us':>8s} {'GB/s':>6s} "
        f"{'bf16/fp8':>8s}"
    )
    for name in shapes:
        n, k = SHAPES[name]
        bf16 = (rng.standard_normal((n, k)).astype(np.float32) * 0.05).view(np.uint32) >> 16
        codes = rng.integers(0, 0x7E, (n, k), dtype=np.uint8) | (
            rng.integers(0, 2, (n, k), dtype=np.uint8) << 7
        )  # every e4m3 code but the NaNs (0x7F, 0xFF)
        scales = np.full((n, 1), 0.01, np.float32).view(np.uint8)
        weights = {
            "bf16": upload_matrix(
                bf16.astype(np.uint16), QType.BF16, (n, k), x_bf16=True, stream=stream
            ),
            "fp8": upload_matrix(
                np.concatenate([codes, scales], axis=1),
                FP8_ROWS,
                (n, k),
                x_bf16=True,
                stream=stream,
            ),
        }
        del bf16, codes
        nbytes = {"bf16": 2 * n * k, "fp8": n * k + 4 * n}
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(default_module.x_scratch_words(m, k), np.uint32, stream=stream)
            us = {
                kind: numba_us(
                    stream,
                    lambda w=w, x=x, o=out, xs=xs: w.matmul(x, o, x_scratch=xs, stream=stream),
                )
                for kind, w in weights.items()
            }
            gb = {kind: nbytes[kind] / us[kind] / 1e3 for kind in us}
            print(
                f"{name:14s} {m:5d} {us['bf16']:8.1f} {gb['bf16']:6.0f} {us['fp8']:8.1f} "
                f"{gb['fp8']:6.0f} {us['bf16'] / us['fp8']:8.2f}"
            )
            del x, out, xs
        del weights


def bench_rows(stream, mod, x, xs, packed, out, linear_rows):
    """linear_rows: us, and the outputs whose bits differ from linear_mma's (must be 0); a
    variant that refuses W says so."""
    mod.linear_mma(x, packed, out, x_scratch=xs, stream=stream)
    ref = out.copy_to_host(stream=stream)
    stream.synchronize()
    try:
        linear_rows(
            mod.split_x(x, xs, x_bf16=packed.x_bf16, stream=stream), packed, out, stream=stream
        )
    except ValueError as e:
        return f"refused ({e})"
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    bad = int(np.count_nonzero(got.view(np.uint32) != ref.view(np.uint32)))

    def fn():
        linear_rows(
            mod.split_x(x, xs, x_bf16=packed.x_bf16, stream=stream), packed, out, stream=stream
        )

    return f"rows {numba_us(stream, fn):7.1f} us bits {bad}"


def load_variant(path):
    spec = importlib.util.spec_from_file_location("variant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="1,2,4,8,16,32,64")
    p.add_argument("--prefill", default="1024")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--gemv", action="store_true", help="also time the GEMV kernel (M <= 8)")
    p.add_argument(
        "--variant",
        help="a copy of kernels/cuda/_linear_mma.py (with --gemm: of _gemm_mma.py) to time instead",
    )
    p.add_argument("--gemm", action="store_true", help="time gemm_mma (prefill) instead")
    p.add_argument("--wgmma", action="store_true", help="time gemm_wgmma against gemm_mma")
    p.add_argument(
        "--rows", action="store_true", help="also time linear_rows (M > 8; x split included)"
    )
    p.add_argument(
        "--rows-variant",
        default="",
        help="copies of kernels/cuda/_linear_rows.py (comma-separated) timed beside it with --rows",
    )
    p.add_argument("--gemm-ms", default="128,512,1024,4096")
    p.add_argument("--x-bf16", action="store_true", help="W packed for x rounded to bf16")
    p.add_argument("--fp8", action="store_true", help="FP8 weights against bf16 at each M")
    args = p.parse_args()
    if args.fp8:
        ms = [int(m) for m in args.ms.split(",")] + [int(m) for m in args.prefill.split(",") if m]
        bench_fp8(ms, args.shapes.split(","))
        return
    if args.wgmma:
        from vtllm.kernels.cuda import _gemm_wgmma as gemm_wgmma

        wg = load_variant(args.variant) if args.variant else gemm_wgmma
        print(
            f"gemm_wgmma: {wg.WARPGROUPS} warpgroups, {wg.TOKENS} tokens, "
            f"{wg.STAGES} stages of {wg.STAGE_TILES} K tiles"
        )
        bench_wgmma([int(m) for m in args.gemm_ms.split(",")], args.shapes.split(","), wg)
        return
    if args.gemm:
        gmod = load_variant(args.variant) if args.variant else default_gemm_module
        bench_gemm(
            [int(m) for m in args.gemm_ms.split(",")], args.shapes.split(","), gmod, args.x_bf16
        )
        return
    mod = default_module
    if args.variant:
        mod = load_variant(args.variant)
        print(f"variant {args.variant}: WARPS={mod.WARPS} UNROLL={mod.UNROLL}")
    rows_mods = [default_rows_module] + [load_variant(f) for f in args.rows_variant.split(",") if f]
    ms = [int(m) for m in args.ms.split(",")] + [int(m) for m in args.prefill.split(",") if m]
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    print(
        f"{'shape':14s} {'M':>5s} {'ours us':>8s} {'GB/s':>6s} {'TFLOP/s':>7s} "
        f"{'torch us':>8s} {'GB/s':>6s} {'TFLOP/s':>7s} {'ours/torch':>10s} {'gemv / rows':>8s}"
    )
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        wt = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        w_bits = cuda.as_cuda_array(wt.view(torch.int16)).view(np.uint16)
        packed = mod.pack_bf16(w_bits, x_bf16=args.x_bf16, stream=stream)
        stream.synchronize()
        for m in ms:
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32), stream=stream)
            out = cuda.device_array((m, n), np.float32, stream=stream)
            xs = cuda.device_array(mod.x_scratch_words(m, k), np.uint32, stream=stream)

            def ours_fn(x=x, p=packed, o=out, xs=xs):
                mod.linear_mma(x, p, o, x_scratch=xs, stream=stream)

            ours = numba_us(stream, ours_fn)
            gemv = ""
            if args.rows and m > 8:
                gemv = " | ".join(
                    bench_rows(stream, mod, x, xs, packed, out, r.linear_rows) for r in rows_mods
                )
            if args.gemv and m <= 8:
                us = numba_us(
                    stream, lambda x=x, w=w_bits, o=out: linear(x, w, QType.BF16, o, stream=stream)
                )
                gemv = f"{us:8.1f}"
            xt = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            peer = torch_us(lambda xt=xt, wt=wt: torch.nn.functional.linear(xt, wt))
            gb = n * k * 2 / 1e3
            tf = 2 * m * n * k / 1e6
            print(
                f"{name:14s} {m:5d} {ours:8.1f} {gb / ours:6.0f} {tf / ours:7.1f} "
                f"{peer:8.1f} {gb / peer:6.0f} {tf / peer:7.1f} {peer / ours:10.2f} {gemv}"
            )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
