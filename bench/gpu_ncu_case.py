"""Launches one kernel case three times, for Nsight Compute to profile one launch. From the
repo root, on a machine with an NVIDIA GPU and the [cuda] extra:
    python -m bench.gpu_ncu_case attn HQ HK D BATCH CONTEXT {f32,bf16}
    python -m bench.gpu_ncu_case rows N K M        (linear_rows, x split hi + lo)
    python -m bench.gpu_ncu_case mma N K M         (linear_mma)
    python -m bench.gpu_ncu_case gemm N K M        (gemm_mma, W packed for x_bf16)
Random inputs, one sequence per row with CONTEXT keys in shuffled 16-slot blocks. Under ncu
(the factory-made kernels are all named `kernel`: match the factory in the demangled name),
e.g. the decode split kernel at the 8B shape, batch 32, 1,024 keys, with stall reasons:
    STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio'
    ncu --kernel-name-base demangled --kernel-name regex:split_kernel_for \\
        --launch-skip 2 --launch-count 1 --metrics "$STALLS,smsp__inst_executed.sum" \\
        python -m bench.gpu_ncu_case attn 32 8 128 32 1024 f32
(--section SpeedOfLight --section WarpStateStats --section Occupancy ... for the overview;
regex:rows_kernel, regex:block_kernel (linear_mma), regex:gemm_kernel for the others). Stall
ratios are cycles per issued instruction (short_scoreboard: shared-memory
results, long_scoreboard: global loads, no_instruction: instruction fetch)."""

import sys

import numpy as np
from numba import cuda

from vtllm.models.synthetic import to_bf16_bits


def attention_case(rng, stream, hq, hk, d, batch, ctx, kv):
    from vtllm.kernels.cuda._attention_split import decode_attention
    from vtllm.kernels.cuda.attention import make_scratch

    bs = 16
    per = -(-ctx // bs)
    blocks = batch * per + 1

    def cache():
        v = rng.standard_normal((blocks, bs, hk, d)).astype(np.float32)
        return cuda.to_device(to_bf16_bits(v) if kv == "bf16" else v)

    k_cache, v_cache = cache(), cache()
    tables = (1 + rng.permutation(batch * per)).reshape(batch, per).astype(np.int32)
    meta = [
        cuda.to_device(a)
        for a in (tables, np.full(batch, ctx, np.int32), np.arange(batch + 1, dtype=np.int32))
    ]
    q = cuda.to_device(rng.standard_normal((batch, hq, d)).astype(np.float32))
    out = cuda.device_array((batch, hq, d), np.float32)
    scratch = make_scratch(batch, hq, d, max(ctx, 1))
    return lambda: decode_attention(
        q, k_cache, v_cache, *meta, d**-0.5, out, scratch, stream=stream
    )


def linear_case(rng, stream, mode, n, k, m):
    from vtllm.kernels.cuda._gemm_mma import gemm_mma
    from vtllm.kernels.cuda._linear_mma import linear_mma, pack_bf16, split_x, x_scratch_words
    from vtllm.kernels.cuda._linear_rows import linear_rows

    x_bf16 = mode == "gemm"
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.02
    w = pack_bf16(cuda.to_device(to_bf16_bits(w)), x_bf16=x_bf16, stream=stream)
    x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32))
    out = cuda.device_array((m, n), np.float32)
    scratch = cuda.device_array(x_scratch_words(m, k), np.uint32)
    if mode == "mma":
        return lambda: linear_mma(x, w, out, x_scratch=scratch, stream=stream)
    xp = split_x(x, scratch, x_bf16=x_bf16, stream=stream)
    if mode == "rows":
        return lambda: linear_rows(xp, w, out, stream=stream)
    return lambda: gemm_mma(xp, w, out, stream=stream)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    if mode == "attn":
        launch = attention_case(rng, stream, *map(int, args[:5]), args[5])
    elif mode in ("rows", "mma", "gemm"):
        launch = linear_case(rng, stream, mode, *map(int, args[:3]))
    else:
        sys.exit(__doc__)
    for _ in range(3):
        launch()
    stream.synchronize()
    print("launched", mode, *args)


if __name__ == "__main__":
    main()
