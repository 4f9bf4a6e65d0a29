"""Shadow check: replay one chunk of a finished step the synchronous way and compare.

At depth 2 a chunk's input ids come from the device mirror (placeholders) and its request is
batched with whatever else was running. The replay feeds the ids the host now knows, runs the
chunk alone, and samples into a scratch copy of the mirror. Kernels are batch invariant and
sampling is counter-based, so a correct engine gives the same token; the KV rows it rewrites
get the same bits. Off by default (VT_SHADOW_CHECK_RATE): it costs a forward pass.
"""

import numpy as np

from vtllm.models.llama import ForwardBatch


def replay_chunk(runner, slot: int, start: int, known_ids: list[int]) -> int:
    """Recompute tokens [start, len(known_ids) - 1) of `slot` alone; return the sampled token,
    which a correct engine makes equal to known_ids[-1]."""
    end = len(known_ids) - 1
    positions = np.arange(start, end, dtype=np.int32)
    blocks = runner.block_tables[slot, positions // runner.block_size]
    batch = ForwardBatch(
        input_ids=np.asarray(known_ids[start:end], np.int32),
        positions=positions,
        slot_mapping=(blocks * runner.block_size + positions % runner.block_size).astype(np.int32),
        query_start_loc=np.asarray([0, end - start], np.int32),
        seq_lens=np.asarray([end], np.int32),
        block_tables=np.ascontiguousarray(runner.block_tables[slot : slot + 1]),
        logits_rows=np.asarray([end - start - 1], np.int32),
    )
    logits = runner.model.forward(batch, runner.kv)
    mirror = runner.token_ids.copy()
    mirror[slot, :end] = known_ids[:end]
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
