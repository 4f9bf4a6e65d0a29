"""Speculative chunks on the GPU, without the host in the loop (executor/cuda_speculative).

  write_drafts: a step's drafts into the device token mirror before the forward, from a
      per-token field staged with the step's metadata (-1 where a row carries no draft), so
      the input gather and the sampler's history read them as the CPU's mirror holds them;
  next_round: which rows verification round j samples. Round 0 is the step's ordinary draw
      (one row per sampling chunk); round j >= 1 samples row j of a chunk whose draw of round
      j - 1 equalled its draft j - 1, and nothing (slot -1) for the others. The rule is the
      CPU's (executor/speculative.verify_drafts): accept while the draw equals the draft.
A chunk's drafts sit on the token rows right after its first logits row; the row after its
last draft is another chunk's first token (or past the step), which carries no draft, so a
chain of equal draws never runs into another chunk's drafts.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check, grid_blocks
from vtllm.kernels.cuda._ptx import grid_dependency_sync

__all__ = ["next_round", "write_drafts"]

THREADS = 32 if SIMULATOR else 128
MAX_BLOCKS = 4 if SIMULATOR else 1024  # grid-stride loops cover the rest


@cuda.jit(cache=True)
def _write_drafts_kernel(token_ids, slots, positions, drafts):
    grid_dependency_sync()
    for t in range(cuda.grid(1), drafts.shape[0], cuda.gridsize(1)):
        d, s, p = drafts[t], slots[t], positions[t]
        if d >= 0 and 0 <= s < token_ids.shape[0] and 0 <= p < token_ids.shape[1]:
            token_ids[s, p] = d


def write_drafts(token_ids, slots, positions, drafts, *, stream=0) -> None:
    """token_ids[slots[t], positions[t]] = drafts[t] where drafts[t] >= 0 (and the slot and
    position are in range: padding is slot -1). token_ids [max_slots, max_len] int32; slots,
    positions, drafts [T] int32."""
    check("write_drafts", "token_ids", token_ids, np.int32, 2)
    check("write_drafts", "drafts", drafts, np.int32, 1)
    n = drafts.shape[0]
    check("write_drafts", "slots", slots, np.int32, 1, (n,))
    check("write_drafts", "positions", positions, np.int32, 1, (n,))
    if n:
        blocks = min(MAX_BLOCKS, grid_blocks(n, THREADS))
        _write_drafts_kernel[blocks, THREADS, stream](token_ids, slots, positions, drafts)


@cuda.jit(cache=True)
def _next_round_kernel(
    j,
    drafts,
    logits_rows,
    sample_rows,
    sample_slots,
    sample_positions,
    prev_tokens,
    round_slots,
    round_positions,
    round_rows,
):
    grid_dependency_sync()
    for b in range(cuda.grid(1), sample_slots.shape[0], cuda.gridsize(1)):
        r = sample_rows[b]
        t = logits_rows[r] + j if 0 <= r < logits_rows.shape[0] else -1  # draft j - 1's row
        alive = 0 <= t < drafts.shape[0] and drafts[t] >= 0 and prev_tokens[b] == drafts[t]
        round_slots[b] = sample_slots[b] if alive else -1
        round_positions[b] = sample_positions[b] + j
        round_rows[b] = r + j if alive else -1


def next_round(
    j: int,
    drafts,
    logits_rows,
    sample_rows,
    sample_slots,
    sample_positions,
    prev_tokens,
    round_slots,
    round_positions,
    round_rows,
    *,
    stream=0,
) -> None:
    """Round j's rows (j >= 1) from round j - 1's draws prev_tokens [B] (-1: not drawn).
    Sampling chunk b keeps drawing when its draw equalled drafts[logits_rows[sample_rows[b]]
    + j]; then round_slots[b] = sample_slots[b], round_rows[b] = sample_rows[b] + j (its
    logits row), else -1 for both. round_positions[b] = sample_positions[b] + j.
    drafts [T], logits_rows [R] int32; the rest [B] int32."""
    if j < 1:
        raise ValueError(f"next_round: round {j}; rounds after the first start at 1")
    check("next_round", "drafts", drafts, np.int32, 1)
    check("next_round", "logits_rows", logits_rows, np.int32, 1)
    check("next_round", "sample_rows", sample_rows, np.int32, 1)
    n = sample_rows.shape[0]
    for name, a in (
        ("sample_slots", sample_slots),
        ("sample_positions", sample_positions),
        ("prev_tokens", prev_tokens),
        ("round_slots", round_slots),
        ("round_positions", round_positions),
        ("round_rows", round_rows),
    ):
        check("next_round", name, a, np.int32, 1, (n,))
    if n:
        blocks = min(MAX_BLOCKS, grid_blocks(n, THREADS))
        _next_round_kernel[blocks, THREADS, stream](
            np.int32(j),
            drafts,
            logits_rows,
            sample_rows,
            sample_slots,
            sample_positions,
            prev_tokens,
            round_slots,
            round_positions,
            round_rows,
        )
