#!/usr/bin/env bash
# CUDA kernels on the GPU machine: the tests/kernels_cuda suite on the real device (no
# simulator; larger shapes switch on there), then launcher timings at real model shapes.
# From the repo root, on the device machine (see the lead's .device/bootstrap.sh):
#   source .device/bootstrap.sh && bash tools/device_check_cuda_kernels.sh
# Writes pytest.log and timings.txt under $OUT when it is set (the device tool's output folder).
set -uo pipefail
out="${OUT:-$(mktemp -d)}"
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1
unset NUMBA_ENABLE_CUDASIM
python3 - <<'PY'
import numba, numpy
from numba import cuda
dev = cuda.get_current_device()
print("numba", numba.__version__, "numpy", numpy.__version__, "numba.cuda:",
      getattr(cuda, "implementation", "?"), "device:", dev.name, dev.compute_capability)
PY
start=$(date +%s)
python3 -m pytest -q -m cudasim -p no:cacheprovider --durations=10 tests/kernels_cuda 2>&1 \
    | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
echo "pytest exit $status after $(( $(date +%s) - start )) s"
python3 - <<'PY' 2>&1 | tee "$out/timings.txt"
"""Median of 5 timings, each over 20 back-to-back launches through the Python launcher, so a
kernel shorter than the launch overhead (~tens of us) shows that overhead instead."""
import time

import numpy as np
from numba import cuda

from vtllm.kernels import BLOCK_BYTES, QK, QType
from vtllm.kernels.cuda import (device_table, linear, paged_attention, rms_norm, sample,
                                silu_and_mul)
from vtllm.kernels.sampling_table import SamplingTable

rng = np.random.default_rng(0)


def timed(fn, reps=20, rounds=5):
    fn()
    cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = cuda.event(), cuda.event()
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(cuda.event_elapsed_time(a, b) / reps * 1e3)  # us
    return float(np.median(times))


def weight(qtype, n, k):
    if qtype == QType.BF16:  # random bf16 bits: any sign and mantissa, magnitude [2^-7, 2^-6)
        return (rng.integers(0, 1 << 16, (n, k), dtype=np.uint16) & 0x807F) | 0x3C00
    w = rng.integers(0, 256, (n, k // QK * BLOCK_BYTES[qtype]), dtype=np.uint8)
    blocks = w.reshape(-1, BLOCK_BYTES[qtype])
    blocks[:, :2] = np.float16(0.01).reshape(1).view(np.uint8)
    if qtype == QType.Q4_1:
        blocks[:, 2:4] = np.float16(-0.05).reshape(1).view(np.uint8)
    return w


print(f"{'op':58s} {'us':>9s} {'GB/s':>7s}")
for qtype in (QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q8_0):
    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)):
        w = cuda.to_device(weight(qtype, n, k))
        for m in (1, 8, 32) if (n, k) == (14336, 4096) else (1,):
            x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32))
            out = cuda.device_array((m, n), np.float32)
            us = timed(lambda: linear(x, w, qtype, out))
            gbs = (w.nbytes + x.nbytes + out.nbytes) / us / 1e3
            print(f"linear {qtype.name:5s} M={m:<3d} N={n:<6d} K={k:<6d}{'':21s} {us:9.1f} {gbs:7.0f}")
        del w

for name, b, ctx, n_new in (("decode", 32, 2048, 1), ("decode", 1, 8192, 1),
                            ("prefill", 1, 512, 512)):
    hq, hk, d, bs = 32, 8, 128, 16
    per = -(-ctx // bs)
    kc = cuda.to_device(rng.standard_normal((b * per, bs, hk, d)).astype(np.float32))
    vc = cuda.to_device(rng.standard_normal((b * per, bs, hk, d)).astype(np.float32))
    tables = cuda.to_device(np.arange(b * per, dtype=np.int32).reshape(b, per))
    lens = cuda.to_device(np.full(b, ctx, np.int32))
    qsl = cuda.to_device(np.arange(b + 1, dtype=np.int32) * n_new)
    q = cuda.to_device(rng.standard_normal((b * n_new, hq, d)).astype(np.float32))
    out = cuda.device_array((b * n_new, hq, d), np.float32)
    us = timed(lambda: paged_attention(q, kc, vc, tables, lens, qsl, d**-0.5, out), reps=5)
    kv_bytes = 2 * b * ctx * hk * d * 4
    print(f"paged_attention {name:7s} B={b:<3d} ctx={ctx:<5d} Hq={hq} Hk={hk} D={d}{'':9s} "
          f"{us:9.1f} {kv_bytes / us / 1e3:7.0f}")

x = cuda.to_device(rng.standard_normal((32, 4096)).astype(np.float32))
wn = cuda.to_device(np.ones(4096, np.float32))
res = cuda.to_device(rng.standard_normal((32, 4096)).astype(np.float32))
o = cuda.device_array((32, 4096), np.float32)
print(f"{'rms_norm T=32 H=4096 +residual':58s} "
      f"{timed(lambda: rms_norm(x, wn, 1e-5, o, residual=res)):9.1f}")
g = cuda.to_device(rng.standard_normal((32, 2 * 14336)).astype(np.float32))
o2 = cuda.device_array((32, 14336), np.float32)
print(f"{'silu_and_mul T=32 I=14336':58s} {timed(lambda: silu_and_mul(g, o2)):9.1f}")

V, B = 128256, 32
logits = cuda.to_device(rng.standard_normal((B, V)).astype(np.float32) * 3)
slots = cuda.to_device(np.arange(B, dtype=np.int32))
pos = cuda.to_device(np.full(B, 10, np.int32))
ids, num = cuda.device_array((B, 64), np.int32), cuda.device_array(B, np.int32)
out_t = cuda.device_array(B, np.int32)
for temp in (0.0, 0.8):
    table = SamplingTable.create(B)
    table.temperature[:] = temp
    dt = device_table(table)
    us = timed(lambda: sample(logits, slots, pos, dt, ids, num, out_t))
    print(f"{f'sample B={B} V={V} temperature={temp}':58s} {us:9.1f} {logits.nbytes / us / 1e3:7.0f}")

t0 = time.time()
linear(x, cuda.to_device(weight(QType.BF16, 4096, 4096)), QType.BF16,
       cuda.device_array((32, 4096), np.float32))
cuda.synchronize()
print(f"(one more launch, arrays just copied: {1e3 * (time.time() - t0):.1f} ms)")
PY
exit "$status"
