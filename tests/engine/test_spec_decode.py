"""N-gram speculation on the real CPU engine: outputs equal those without it, exactly.

A tiny random checkpoint with a small vocabulary (its greedy and sampled outputs fall into
cycles, so prompt lookup often proposes the right tokens; on plain prompts it mostly proposes
wrong ones). The workload mixes copy-heavy and plain prompts of different lengths, greedy,
seeded and penalised sampling, logprobs, stop ids, stop strings, min_tokens and a constrained
request (which does not speculate), under a KV budget small enough to force preemptions.
Kernels are batch invariant and the verification draws what one-token steps would draw, so
every token, logprob, finish reason and text must match, at depth 1 and at depth 2.
"""

import random

import anyio
import numpy as np
import pytest

from tests.models.runner_util import make_runner
from vtllm.config import parse_speculative_config, resolve
from vtllm.engine import loop as loop_module
from vtllm.engine.build import build_parts
from vtllm.engine.loop import StepLoop
from vtllm.engine.speculative_text import push_run
from vtllm.errors import InvalidParameter
from vtllm.executor.cuda_graph_steps import (
    graph_shape,
    pad_graph_step,
    spec_bucket,
    spec_graph_buckets,
)
from vtllm.executor.speculative import first_sample_positions, token_drafts
from vtllm.executor.step_layout import flatten_chunks, graph_buckets
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.plan import Chunk, SampledToken, SeatedRequest, StepPlan, StepResult
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler
from vtllm.scheduler.speculative import NgramProposer

VOCAB = 24
# steps of five running requests or more carry no drafts (the KV pool seldom holds more)
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3, "disable_by_batch_size": 5}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_checkpoint(
        tmp_path_factory.mktemp("spec"), "tiny", seed=3, vocab=VOCAB, peaked=True
    )
    return load_model(path)


def _workload(tiny, seed: int = 5):
    rng = random.Random(seed)
    letters = [tiny.tokenizer.decode([t]) for t in range(3, VOCAB)]
    work = []
    for i in range(24):
        if i % 2:  # copy-heavy: a segment repeated, then its start again
            segment = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 8))]
            prompt = segment * rng.randint(2, 4) + segment[: rng.randint(1, 3)]
        else:
            prompt = [rng.randrange(3, VOCAB) for _ in range(rng.choice([1, 5, 17, 40]))]
        kind = rng.choice(["greedy", "greedy", "seeded", "penalties", "topk"])
        params = dict(max_tokens=rng.randint(4, 28), ignore_eos=rng.random() < 0.7)
        if kind == "greedy":
            params["temperature"] = 0.0
        else:
            params.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(1 << 30))
        if kind == "penalties":
            params.update(repetition_penalty=1.2, frequency_penalty=0.3)
        elif kind == "topk":
            params["top_k"] = 4
        if rng.random() < 0.3:
            params["stop_token_ids"] = [rng.randrange(3, VOCAB)]
        if rng.random() < 0.4:
            # token 10 is where this checkpoint's outputs often settle: its letter three
            # times ends requests inside speculative runs
            params["stop"] = [letters[10 - 3] * 3] if i % 2 else rng.sample(letters, 2)
        if rng.random() < 0.2:
            params["min_tokens"] = 3
        if rng.random() < 0.3:
            params["logprobs"] = 2
        if rng.random() < 0.2:  # prompt rows beside speculative rows in one step's logits
            params["prompt_logprobs"] = 1
        if i == 5:
            params["allowed_token_ids"] = list(range(3, 12))
        work.append((f"r{i}", prompt, SamplingParams(**params), None))
    return work


async def _serve(loop: StepLoop, work):
    """request id -> (tokens, logprobs, prompt logprobs, finish reason, stop reason, text)."""
    results = {}

    async def consume(request_id, collector):
        tokens, logprobs, prompt_logprobs, text = [], [], [], ""
        while True:
            update = await collector.get()
            tokens += update.token_ids
            logprobs += [(lp.token_id, lp.logprob, lp.top_ids) for lp in update.logprobs]
            prompt_logprobs += [(lp.token_id, lp.logprob) for lp in update.prompt_logprobs]
            text += update.text
            if update.finished:
                break
        reasons = (update.finish_reason, update.stop_reason, update.num_output_tokens)
        results[request_id] = (tokens, logprobs, prompt_logprobs, *reasons, text)

    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        async with anyio.create_task_group() as consumers:
            for request_id, prompt, params, _ in work:
                consumers.start_soon(consume, request_id, loop.add(request_id, prompt, params))
        loop.stop()
    return results


def _run(tiny, work, depth: int, spec: dict | None):
    config, _ = resolve(
        async_depth=depth,
        kv_cache_memory=24 * 2048,  # 24 blocks of 4 tokens: preemptions
        block_size=4,
        max_num_seqs=8,
        max_num_batched_tokens=48,
        max_model_len=96,
        speculative_config=spec,
    )
    _, scheduler, backend, _ = build_parts(config, tiny)
    shadow_rate = 0.5 if depth == 2 else 0.0  # replays of the other chunks still agree
    loop = StepLoop(
        scheduler,
        backend,
        tiny.tokenizer,
        async_depth=depth,
        shadow_rate=shadow_rate,
        vocab_size=tiny.config.vocab_size,
    )
    results = anyio.run(_serve, loop, work)
    assert loop.shadow.num_mismatches == 0
    scheduler.check_invariants()
    assert scheduler.num_used_blocks == 0 and not scheduler.requests
    backend.close()
    return results, scheduler, loop.shadow.num_checks


@pytest.fixture(scope="module")
def plain(tiny):
    work = _workload(tiny)
    return work, _run(tiny, work, 1, None)[0]


def odd_requests_wait(monkeypatch) -> None:
    """At depth 2, requests r1, r3, ... always wait for their token in flight (as a draft
    model's do), the others only where the n-gram lookup expects a proposal: both rules in one
    run, and enough speculative runs for stop strings to cut."""
    lookup = NgramProposer.expects

    def expects(self, req):
        return int(req.request_id[1:]) % 2 == 1 or lookup(self, req)

    monkeypatch.setattr(NgramProposer, "expects", expects)


@pytest.mark.parametrize("depth", [1, 2])
def test_speculation_changes_no_output(tiny, plain, depth, monkeypatch):
    work, expected = plain
    cut_runs = []  # speculative runs a stop string cut short

    def spy(text, delta, visible):
        before = len(delta.token_ids)
        out = push_run(text, delta, visible)
        if len(delta.token_ids) < before:
            cut_runs.append(delta.request_id)
        return out

    monkeypatch.setattr(loop_module, "push_run", spy)
    if depth == 2:
        odd_requests_wait(monkeypatch)
    results, scheduler, shadow_checks = _run(tiny, work, depth, SPEC)
    assert shadow_checks > 10 or depth == 1
    for request_id, *_ in work:
        assert results[request_id] == expected[request_id], request_id
    stats = scheduler.spec_stats
    # proposals hit, at later positions too, and miss
    assert stats.num_accepted_tokens > 30 and stats.accepted_per_pos[1] > 0, stats
    assert stats.num_draft_tokens - stats.num_accepted_tokens > 20, stats  # rejected ones
    assert scheduler.num_preemptions > 0
    assert any(isinstance(r[4], str) for r in expected.values()), "a stop string should hit"
    assert sum(bool(r[2]) for r in expected.values()) >= 3, "prompt logprobs"
    assert cut_runs, "a stop string should end a request inside a speculative run"


def test_disable_by_batch_size_defaults_to_8_and_is_checked():
    ngram = '{"method": "ngram", "num_speculative_tokens": 2'
    assert parse_speculative_config(ngram + "}").disable_by_batch_size == 8
    draft = '{"method": "draft_model", "model": "m", "num_speculative_tokens": 2'
    assert (
        parse_speculative_config(draft + ', "disable_by_batch_size": 3}').disable_by_batch_size == 3
    )
    for bad in ("0", '"4"', "true"):
        with pytest.raises(InvalidParameter, match="disable_by_batch_size must be an integer"):
            parse_speculative_config(ngram + f', "disable_by_batch_size": {bad}}}')


@pytest.mark.parametrize("limit, drafts", [(3, False), (4, True), (0, True)])
def test_no_drafts_while_the_batch_reaches_disable_by_batch_size(limit, drafts):
    """Three running requests whose next tokens prompt lookup finds: a step carries drafts
    only while fewer than disable_by_batch_size requests run (0: always); a batch that does
    not speculate is planned again before its tokens are back (depth 2), one that does waits
    for them (its proposals need them)."""
    config = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        block_size=4,
        num_blocks=64,
        num_speculative_tokens=3,
        prompt_lookup_max=3,
        speculative_disable_by_batch_size=limit,
    )
    scheduler = Scheduler(config)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", [2, 3, 4, 2, 3], params, seed=i))
    plan = scheduler.schedule()
    scheduler.update(StepResult(plan.step_id, [SampledToken(c.slot, 4) for c in plan.chunks]))
    plan = scheduler.schedule()
    assert [c.draft_token_ids for c in plan.chunks] == [[2, 3, 4] if drafts else []] * 3
    scheduler.check_invariants()
    ahead = scheduler.schedule()
    assert (ahead is None) == drafts
    if ahead is not None:
        assert [(c.start, c.num_tokens) for c in ahead.chunks] == [(6, 1)] * 3


def test_speculative_graphs_cover_the_batches_that_speculate():
    buckets = graph_buckets(8, 64)  # 1, 2, 4, 8, then prefill sizes
    assert spec_graph_buckets(buckets, 8, 64, 3, 3) == [1, 2, 4]  # batches of up to 3
    assert spec_graph_buckets(buckets, 8, 64, 3, 8) == [1, 2, 4, 8]
    assert spec_graph_buckets(buckets, 8, 24, 3, 8) == [1, 2, 4]  # 8 * 4 rows exceed 24
    assert spec_graph_buckets(buckets, 8, 64, 3, 0) == []  # no batch speculates
    assert spec_graph_buckets(buckets, 8, 64, 0, 8) == []  # no speculation
    # the smallest bucket holding both the sequences and the tokens, or none (eager)
    for (tokens, seqs), want in {(4, 1): 1, (5, 1): 2, (3, 3): 4, (17, 3): 0}.items():
        assert spec_bucket([1, 2, 4], 3, tokens, seqs) == want


def test_a_step_with_drafts_pads_to_its_graph():
    """A decode with two drafts, a plain decode and a prompt part in the graph of 4 sequences
    and 3 rounds: the real rows kept in place, then token rows of slot -1 without drafts,
    logits rows -1 (zero rows) and samples of slot -1 and row -1, which no round draws."""
    chunks = [
        Chunk(0, 9, 3, [], True, False, [5, 6]),
        Chunk(1, 4, 1, [], True),
        Chunk(2, 0, 3, [], False),
    ]
    tables = np.arange(3 * 4, dtype=np.int32).reshape(3, 4)
    flat = flatten_chunks(chunks, tables, 4)
    sampled = chunks[:2]
    fields = {
        "token_slots": flat.token_slots,
        "positions": flat.positions,
        "slot_mapping": flat.slot_mapping,
        "query_start_loc": flat.query_start_loc,
        "seq_lens": flat.seq_lens,
        "block_tables": tables[flat.slots],
        "logits_rows": flat.logits_rows,
        "sample_rows": flat.sample_rows,
        "sample_slots": [c.slot for c in sampled],
        "sample_positions": first_sample_positions(sampled),
        "sample_masks": [-1, -1],
        "token_drafts": token_drafts(flat, sampled),
    }
    key = (spec_bucket([1, 2, 4], 3, len(flat.positions), len(flat.slots)), 3)
    assert key == (4, 3)
    counts = graph_shape(key, 8)
    assert counts == (16, 4, 16, 4)
    padded = pad_graph_step(key, fields, counts)
    pad = [-1] * 9
    assert padded["token_slots"].tolist() == [0, 0, 0, 1, 2, 2, 2] + pad
    assert padded["slot_mapping"].tolist()[7:] == pad
    assert padded["token_drafts"].tolist() == [-1, 5, 6, -1, -1, -1, -1] + pad
    assert padded["query_start_loc"].tolist() == [0, 3, 4, 7, 7]
    assert padded["seq_lens"].tolist() == [12, 5, 3, 0]
    assert padded["logits_rows"].tolist() == [0, 1, 2, 3] + [-1] * 12
    assert padded["sample_rows"].tolist() == [0, 3, -1, -1]
    assert padded["sample_slots"].tolist() == [0, 1, -1, -1]
    assert padded["sample_positions"].tolist() == [10, 5, 0, 0]
    assert padded["block_tables"].shape == (4, 4) and not padded["block_tables"][3].any()
    with pytest.raises(ValueError, match="exceeds"):
        pad_graph_step((1, 3), fields, graph_shape((1, 3), 8))


def _draws(tiny, prompt, drafts, temperature, num_draws) -> list[list[int]]:
    """The emitted tokens of num_draws requests with seeds 0, 1, ..., each one step that
    verifies `drafts` after `prompt` (the runner's 32 slots run 32 requests a step)."""
    slots, bs = 32, 4
    runner = make_runner(tiny, num_blocks=slots * 4 + 1, block_size=bs, max_num_seqs=slots)
    n = len(prompt) + len(drafts)
    per_slot = -(-n // bs)
    sampling = SamplingParams(temperature=temperature)
    emitted = []
    for step, base in enumerate(range(0, num_draws, slots)):
        seats, chunks = [], []
        for slot in range(slots):
            blocks = list(range(1 + slot * per_slot, 1 + (slot + 1) * per_slot))
            seats.append(SeatedRequest(slot, list(prompt), len(prompt), sampling, base + slot, []))
            chunks.append(Chunk(slot, 0, n, blocks, True, False, list(drafts)))
        freed = list(range(slots)) if step else []
        result = runner.execute(StepPlan(step, seats, chunks, freed))
        emitted += [[s.token_id, *s.more_ids] for s in result.sampled]
    return emitted


def _target_probs(tiny, ids, temperature):
    """The model's distribution of the token after `ids` at this temperature."""
    runner = make_runner(tiny)
    seat = SeatedRequest(0, list(ids), len(ids), SamplingParams(temperature=0), 0, [])
    chunk = Chunk(0, 0, len(ids), list(range(1, 1 + -(-len(ids) // 4))), True)
    logits, _ = runner.compute_logits(StepPlan(0, [seat], [chunk], []))
    z = logits[-1].astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def _assert_follows(tokens: list[int], p: np.ndarray) -> None:
    """Chi-square goodness of fit of the tokens' counts to p; cells expecting fewer than 5
    draws are pooled into one."""
    counts = np.bincount(tokens, minlength=len(p)).astype(np.float64)
    expected = p * len(tokens)
    keep = expected >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    statistic = ((observed - expected) ** 2 / expected).sum()
    assert statistic < chi2_critical(len(observed) - 1), (statistic, observed, expected)


@pytest.mark.parametrize("guess", ["likely", "unlikely"])
def test_sampled_tokens_follow_the_target_distribution(tiny, guess):
    """Seeded draws of one verification step against the model's own distributions, with
    drafts that are often right (the most likely tokens) or often wrong (rare ones): the first
    token must follow p(. | prompt), the first draft must be accepted with probability p(d1),
    and after it the second token must follow p(. | prompt, d1). A verification that favoured
    the drafts, or resampled wrongly after a rejection, shifts the counts far past the
    critical value."""
    prompt, temperature, num_draws = [5, 9, 13, 5, 9], 5.0, 1024  # a spread distribution
    p1 = _target_probs(tiny, prompt, temperature)
    d1 = int(np.argmax(p1) if guess == "likely" else np.argmin(p1))
    p2 = _target_probs(tiny, [*prompt, d1], temperature)
    d2 = int(np.argmax(p2) if guess == "likely" else np.argmin(p2))
    emitted = _draws(tiny, prompt, [d1, d2], temperature, num_draws)
    first = [e[0] for e in emitted]
    _assert_follows(first, p1)
    hits = sum(t == d1 for t in first)
    assert abs(hits / num_draws - p1[d1]) < 4 * np.sqrt(p1[d1] / num_draws) + 0.01
    assert all(len(e) == (1 if e[0] != d1 else 2 if e[1] != d2 else 3) for e in emitted)
    if guess == "likely":
        second = [e[1] for e in emitted if e[0] == d1]
        assert len(second) > 100
        _assert_follows(second, p2)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a statistic of df degrees of freedom exceeds with probability
    about 1e-3 (z: the normal quantile), by Wilson and Hilferty's cube-root approximation."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * np.sqrt(c)) ** 3
