"""Speculative chunks through the CUDA runner, under numba's simulator (or a GPU).

A tiny Qwen3 with heads of a whole warp (one-token steps rotate inside attention, a chunk
with drafts runs qkv_rope and the split / ring kernels): one request driven as the scheduler
drives it, with drafts right and wrong, emits the tokens and logprobs (to the bit) of
one-token steps, its block table rolled back after a rejection, eagerly and through the
graphed path; a row of a chunk with drafts has its one-row decode logits, bit for bit; and the
verification kernels against numpy.
Each simulated forward costs seconds of CPU: the runner cases share one reference run.
"""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.cudasim

BLOCK = 4
VOCAB = 64
PROMPT = [7, 19, 33, 7, 19, 41]
NUM_TOKENS = 6
GREEDY = SamplingParams(temperature=0, logprobs=2, max_tokens=NUM_TOKENS)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = write_checkpoint(
        tmp_path_factory.mktemp("spec"), "tiny-qwen3-d32", seed=9, layers=1, vocab=VOCAB
    )
    return load_model(path)


def _runner(loaded, graphs: bool = False):
    """graphs: the graphed path, each graph replaying its launches eagerly (EagerGraph)."""
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=2,
        max_model_len=32,
        max_num_batched_tokens=8 if graphs else 16,  # graphed: the prompt pads to 8 rows
        kv_cache_memory=1 << 20,
        kv_cache_fraction=0.0,
        use_graphs=graphs,
        speculative_tokens=3,
        speculative_max_batch=2,
    )


class EagerGraph:
    """Stands in for a captured graph where capture needs the driver API, which the
    simulator lacks: a replay runs the recorded launches eagerly. What a graphed step adds
    on the host (its key, the padded metadata, k rounds whatever the drafts) runs as on a
    card; tests/gpu/test_spec_cuda.py replays real graphs."""

    def __init__(self, stream, record, *, programmatic: bool = False):
        self.record = record

    def replay(self) -> None:
        self.record()

    def close(self) -> None:
        pass


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _drive(runner, proposals):
    """One greedy request in slot 0 as the scheduler drives it: a prompt step, then per step
    the last token and proposals(emitted) as drafts (none: a one-token step). Blocks come
    from a counter, never reused: blocks past the computed positions are freed after a
    rejection, and the next step gets new ids for them. Returns (tokens, logprobs) of the
    first NUM_TOKENS emitted; checks the runner's block table against the scheduler's."""
    next_block = iter(range(1, 10_000))
    table: list[int] = []

    def blocks_to(end: int) -> list[int]:
        new = [next(next_block) for _ in range(-(-end // BLOCK) - len(table))]
        table.extend(new)
        return new

    seat = SeatedRequest(0, list(PROMPT), len(PROMPT), GREEDY, 1234, [])
    plan = StepPlan(0, [seat], [Chunk(0, 0, len(PROMPT), blocks_to(len(PROMPT)), True)], [])
    tokens, logprobs, step = [], [], 1
    while True:
        (out,) = runner.execute(plan).sampled
        tokens += [out.token_id, *out.more_ids]
        logprobs += [out.logprobs, *out.more_logprobs]
        computed = len(PROMPT) + len(tokens) - 1  # the newest token's KV is the next step's
        del table[-(-computed // BLOCK) :]  # blocks that held rejected positions only
        assert runner.block_tables[0, : runner.num_slot_blocks[0]].tolist() == table
        if len(tokens) >= NUM_TOKENS:
            return tokens[:NUM_TOKENS], logprobs[:NUM_TOKENS]
        drafts = proposals(tokens)
        n = 1 + len(drafts)
        chunk = Chunk(0, computed, n, blocks_to(computed + n), True, False, drafts)
        plan, step = StepPlan(step, [], [chunk], []), step + 1


@pytest.fixture(scope="module")
def reference(loaded):
    """One-token steps: the runner, its tokens and their logprobs."""
    runner = _runner(loaded)
    return runner, *_drive(runner, lambda _: [])


def test_tokens_equal_one_token_steps_with_drafts_right_and_wrong(loaded, reference):
    """Step 1: one right draft, then two wrong (the block of the rejected positions is given
    back); step 2: two right, then a wrong one. Six tokens in three forwards, each token and
    logprob the one-token steps' to the bit. Then the rows of a step with drafts against the
    reference's one-row steps (check_rows_with_drafts_have_their_one_row_decode_bits)."""
    _, ref, ref_lps = reference
    wrong = [(t + 1) % VOCAB for t in ref]  # never the target's token
    shapes = iter([[ref[1], wrong[2], wrong[3]], [ref[3], ref[4], wrong[5]]])
    got, got_lps = _drive(_runner(loaded), lambda _: next(shapes))
    assert got == ref
    for a, b in zip(got_lps, ref_lps, strict=True):
        assert (a.token_id, a.rank, a.top_ids) == (b.token_id, b.rank, b.top_ids)
        assert _bits(a.logprob) == _bits(b.logprob)
        np.testing.assert_array_equal(_bits(a.top_logprobs), _bits(b.top_logprobs))
    # in the same case: a parallel run's workers would each redo the reference decode
    check_rows_with_drafts_have_their_one_row_decode_bits(reference)


# ~3 minutes of the simulator: on the card only (make test-gpu), beside tests/gpu/test_spec_cuda;
# the graphs' keys and padded metadata are tested on any machine (tests/engine/test_spec_decode).
@pytest.mark.skipif(SIMULATOR, reason="on the card only: ~3 minutes under the simulator")
def test_graphed_steps_with_fewer_drafts_than_rounds(loaded, reference, monkeypatch):
    """The graphed path (graphs of 3 rounds): a step with two drafts (the first right), then
    one with two right drafts, whose last round draws nothing, padded into the graph of one
    sequence: the one-token steps' tokens and logprobs to the bit."""
    from vtllm.executor import cuda_graph_steps

    monkeypatch.setattr(cuda_graph_steps, "CudaGraph", EagerGraph)
    _, ref, ref_lps = reference
    shapes = iter([[ref[1], (ref[2] + 1) % VOCAB], [ref[3], ref[4]]])
    runner = _runner(loaded, graphs=True)
    got, got_lps = _drive(runner, lambda _: next(shapes))
    assert got == ref
    for a, b in zip(got_lps, ref_lps, strict=True):
        assert (a.token_id, a.rank, a.top_ids) == (b.token_id, b.rank, b.top_ids)
        assert _bits(a.logprob) == _bits(b.logprob)
    assert runner.spec_buckets == [1, 2]
    assert set(runner.graphs) == {8, (1, 3)}  # the prompt's, the drafts'
    assert runner.spec_rounds.tokens_host[2][2, 0] == -1  # step 2's third round drew nothing


def check_rows_with_drafts_have_their_one_row_decode_bits(reference):
    """Four rows (the last token and three drafts) over positions the reference computed:
    the last row's logits are the one-row step's at its position, bit for bit (four rows take
    qkv_rope and the ring kernel, one row rotates inside the split kernel)."""
    runner, ref, _ = reference
    n = len(PROMPT)
    chunk = Chunk(0, n, 4, [], True, False, ref[1:4])
    rows, flat = runner.compute_logits(StepPlan(90, [], [chunk], []))
    assert rows.shape[0] == 4 and flat.sample_rows == [0]
    one, _ = runner.compute_logits(StepPlan(91, [], [Chunk(0, n + 3, 1, [], True)], []))
    np.testing.assert_array_equal(_bits(rows[3]), _bits(one[0]))
    assert not np.array_equal(rows[0], rows[3])


def test_late_roll_back_leaves_a_slot_seated_again_alone():
    """The host learns a speculative step's accepted count one step late; a slot freed (and
    seated again) in between belongs to another request, whose block table stays as is."""
    from vtllm.executor.cuda_speculative import roll_back

    class Runner:
        block_size = 4
        num_slot_blocks = np.array([5, 5], np.int32)
        slot_seats = np.array([3, 7])

    chunks = [Chunk(0, 8, 4, [], True, False, [1, 2, 3]), Chunk(1, 8, 4, [], True, False, [1])]
    runner = Runner()
    roll_back(runner, chunks, [([], []), ([], [])], [3, 6])  # slot 1 was seated again since
    assert runner.num_slot_blocks.tolist() == [3, 5]  # slot 0: positions 0..8 in 3 blocks


def test_kernels_match_numpy(rng):
    from numba import cuda

    from vtllm.kernels.cuda.speculative import next_round, write_drafts

    mirror = rng.integers(0, 50, (3, 12)).astype(np.int32)
    # a step: slot 2 decodes (row 0), slot 0 verifies 3 drafts (rows 1..4), slot 1 two (5..7)
    slots = np.array([2, 0, 0, 0, 0, 1, 1, 1, -1], np.int32)
    positions = np.array([6, 4, 5, 6, 7, 9, 10, 11, 0], np.int32)
    drafts = np.array([-1, -1, 60, 61, 62, -1, 70, 71, -1], np.int32)
    mirror_dev = cuda.to_device(mirror)
    dev = {k: cuda.to_device(v) for k, v in dict(s=slots, p=positions, d=drafts).items()}
    write_drafts(mirror_dev, dev["s"], dev["p"], dev["d"])
    want = mirror.copy()
    want[0, 5:8] = [60, 61, 62]
    want[1, 10:12] = [70, 71]
    np.testing.assert_array_equal(mirror_dev.copy_to_host(), want)

    logits_rows = cuda.to_device(np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32))
    # the last sample pads a graph's step (row -1): never drawn, whatever its previous draw
    sample_rows = cuda.to_device(np.array([0, 1, 5, 0, -1], np.int32))
    sample_slots = cuda.to_device(np.array([2, 0, 1, -1, -1], np.int32))
    sample_positions = cuda.to_device(np.array([7, 5, 10, 0, 0], np.int32))
    outs = [cuda.device_array(5, np.int32) for _ in range(3)]
    cases = [  # (round, previous draws, slots, rows)
        (1, [9, 60, 70, -1, 60], [-1, 0, 1, -1, -1], [-1, 2, 6, -1, -1]),
        (1, [9, 61, 71, -1, -1], [-1, -1, -1, -1, -1], [-1, -1, -1, -1, -1]),
        (2, [9, 61, 71, -1, 61], [-1, 0, 1, -1, -1], [-1, 3, 7, -1, -1]),
        (3, [9, 62, 5, -1, 62], [-1, 0, -1, -1, -1], [-1, 4, -1, -1, -1]),
        (4, [9, 63, 5, -1, -1], [-1, -1, -1, -1, -1], [-1, -1, -1, -1, -1]),  # past slot 0's
    ]
    for j, prev, want_slots, want_rows in cases:
        next_round(
            j,
            dev["d"],
            logits_rows,
            sample_rows,
            sample_slots,
            sample_positions,
            cuda.to_device(np.array(prev, np.int32)),
            *outs,
        )
        assert outs[0].copy_to_host().tolist() == want_slots, j
        assert outs[1].copy_to_host().tolist() == [7 + j, 5 + j, 10 + j, j, j]
        assert outs[2].copy_to_host().tolist() == want_rows, j
    with pytest.raises(ValueError, match="round 0"):
        next_round(
            0, dev["d"], logits_rows, sample_rows, sample_slots, sample_positions, *outs, outs[0]
        )
