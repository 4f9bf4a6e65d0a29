"""Shadow replay of one chunk (see engine.shadow_check): the chunk alone, from host ids.

Kernels are batch invariant and sampling is counter-based, so a correct engine samples the
same token the batched step did, and the KV rows the replay rewrites get the same bits. It
samples into a scratch copy of the mirror, so the device state is left as the step left it.
"""

import numpy as np

from vtllm.models.ops import StepInputs


def replay_chunk(runner, slot: int, start: int, known_ids: list[int]) -> int:
    """Recompute positions [start, len(known_ids)) of `slot` alone from the host's ids and
    return the token sampled for the next position."""
    end = len(known_ids)
    positions = np.arange(start, end, dtype=np.int32)
    blocks = runner.block_tables[slot, positions // runner.block_size]
    batch = StepInputs(
        token_slots=np.full(end - start, slot, np.int32),
        input_ids=np.asarray(known_ids[start:end], np.int32),
        positions=positions,
        slot_mapping=(blocks * runner.block_size + positions % runner.block_size).astype(np.int32),
        query_start_loc=np.asarray([0, end - start], np.int32),
        seq_lens=np.asarray([end], np.int32),
        block_tables=np.ascontiguousarray(runner.block_tables[slot : slot + 1]),
        logits_rows=np.asarray([end - start - 1], np.int32),
    )
    logits = runner.model.forward(batch)
    mirror = runner.token_ids.copy()
    mirror[slot, :end] = known_ids
    num_tokens = runner.num_tokens.copy()
    token = np.empty(1, np.int32)
    runner.ops.sample(
        logits,
        np.asarray([slot], np.int32),
        np.asarray([end], np.int32),
        runner.sampling,
        mirror,
        num_tokens,
        token,
    )
    return int(token[0])
