"""method draft_model: a second checkpoint of the same vocabulary proposes greedily.

With the target itself as the draft, its greedy proposals are the target's greedy tokens bit
for bit (the same kernels, batch invariant), so every draft of a greedy request is accepted:
a draft KV cache that went stale after a rejection, an eviction or a preemption would show as
a rejected draft. With another checkpoint as the draft, some drafts are rejected, and outputs
still equal those without speculation."""

import random

import pytest

from tests.engine.test_spec_decode import VOCAB, _run, _workload
from vtllm.config import resolve
from vtllm.engine import speculative_draft
from vtllm.engine.build import build_parts
from vtllm.errors import InvalidParameter
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    make = write_checkpoint
    return {
        "target": make(root / "target", "tiny", seed=3, vocab=VOCAB, peaked=True),
        "other": make(root / "other", "tiny", seed=4, vocab=VOCAB, peaked=True, layers=1),
        "wide": make(root / "wide", "tiny", seed=4, vocab=VOCAB + 8),
    }


@pytest.fixture(scope="module")
def tiny(paths):
    return load_model(paths["target"])


def _spec(path) -> dict:
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": 3}


def test_the_target_as_its_own_draft_is_always_right(tiny, paths, monkeypatch):
    monkeypatch.setattr(speculative_draft, "DRAFT_SLOTS", 3)  # fewer than requests: evictions
    rng = random.Random(2)
    work = []
    for i in range(16):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.choice([2, 9, 30]))]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(2, 30), ignore_eos=True)
        work.append((f"r{i}", prompt, params, None))
    plain, *_ = _run(tiny, work, 1, None)
    results, scheduler, _ = _run(tiny, work, 2, _spec(paths["target"]))
    assert results == plain
    stats = scheduler.spec_stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 100, stats
    assert scheduler.num_preemptions > 0


def test_another_draft_changes_no_output(tiny, paths):
    work = _workload(tiny)
    plain, *_ = _run(tiny, work, 1, None)
    results, scheduler, _ = _run(tiny, work, 2, _spec(paths["other"]))
    assert results == plain
    stats = scheduler.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats
    assert scheduler.proposer.num_forwards > stats.num_drafts


def test_a_draft_of_another_vocabulary_is_refused(tiny, paths):
    config, _ = resolve(speculative_config=_spec(paths["wide"]), kv_cache_memory=1 << 20)
    with pytest.raises(InvalidParameter, match="draft model's vocabulary"):
        build_parts(config, tiny)


def test_draft_kv_follows_rejections(tiny, paths):
    """A proposer that keeps its KV across proposals proposes what one that recomputes
    everything does, while random runs of its drafts are rejected, and while the target steps
    without proposals (drafts dropped for want of KV blocks, say: none of them verified)."""
    from vtllm.kernels import cpu as ops

    def proposer():
        return speculative_draft.draft_proposer(
            str(paths["target"]), tiny, ops, block_size=4, max_num_seqs=2, max_model_len=96
        )

    kept, fresh = proposer(), proposer()
    rng = random.Random(5)
    req = Request("a", [rng.randrange(3, VOCAB) for _ in range(11)], SamplingParams())
    for _ in range(14):
        drafts = kept.propose(req, 3)
        fresh.forget(req)
        assert drafts == fresh.propose(req, 3)
        accepted = rng.choice([0, 0, 1, 3])
        emitted = drafts[:accepted] + [rng.randrange(3, VOCAB)]
        if rng.random() < 0.4:  # steps without proposals
            emitted = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 4))]
        req.output_token_ids += emitted
    assert kept.num_forwards == fresh.num_forwards  # one chunk and k - 1 steps each time
