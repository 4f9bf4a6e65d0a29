"""Random valid K-quant (and Q5_0 / Q5_1) blocks: random bytes for the quants and packed
scales, finite float scales (f16, subnormals included; Q8_K's float32) of magnitudes that
vary block to block."""

import numpy as np

from vtllm.kernels import QType, block_layout

# byte offsets of each type's f16 super-block scales (d, and dmin where the type has one)
F16_SCALES = {
    QType.Q2_K: (80, 82),
    QType.Q3_K: (108,),
    QType.Q4_K: (0, 2),
    QType.Q5_K: (0, 2),
    QType.Q6_K: (208,),
    QType.Q5_0: (0,),
    QType.Q5_1: (0, 2),
}
KQ_TYPES = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q8_K]
PER_TYPE = [*KQ_TYPES, QType.Q5_0, QType.Q5_1]  # the types of the per-type CPU kernels


def random_kquant(rng, qtype, n, k, *, lo=-6.5, hi=-0.5):
    """uint8 [n, k // block * block bytes]; scale magnitudes 10**uniform(lo, hi)."""
    bw, bb = block_layout(qtype)
    w = rng.integers(0, 256, (n, k // bw * bb), dtype=np.uint8)
    blocks = w.reshape(-1, bb)
    nb = len(blocks)
    for off in F16_SCALES.get(qtype, ()):
        mags = 10.0 ** rng.uniform(lo, hi, nb) * rng.choice([-1, 1], nb)
        blocks[:, off : off + 2] = mags.astype(np.float16)[:, None].view(np.uint8)
    if qtype == QType.Q8_K:
        mags = 10.0 ** rng.uniform(lo, hi, nb) * rng.choice([-1, 1], nb)
        blocks[:, 0:4] = mags.astype(np.float32)[:, None].view(np.uint8)
    return w
