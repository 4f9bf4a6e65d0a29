"""The law of the design on the real engine: depth 2 gives the synchronous tokens, exactly.

A tiny random checkpoint keeps it fast; a KV budget of a few blocks forces preemptions, shared
prefixes hit the prefix cache, and some requests are aborted after a set number of tokens.
"""

import random

import anyio
import pytest

from vtllm.config import resolve
from vtllm.engine.build import build_parts
from vtllm.engine.loop import StepLoop
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.sampling_params import SamplingParams, StructuredOutputs

NUM_REQUESTS = 72


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_checkpoint(tmp_path_factory.mktemp("law"), "tiny", seed=7))


def _workload(vocab: int, seed: int):
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(24)]
    work = []
    for i in range(NUM_REQUESTS):
        n = rng.choice([1, 3, 9, 17, 33, 50])
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        if i % 4 == 0:
            prompt = shared + prompt  # prefix-cache hits
        kind = rng.choice(["greedy", "seeded", "topk", "topp", "minp", "penalties", "bias"])
        constraint = rng.choice([None, None, None, "regex", "choice", "allowed", "bad_words"])
        params = dict(max_tokens=rng.randint(1, 24), min_tokens=0, ignore_eos=rng.random() < 0.5)
        if kind == "greedy":
            params["temperature"] = 0.0
        else:  # unseeded requests draw a random seed, so the law needs explicit ones
            params.update(temperature=rng.choice([0.5, 1.0, 1.5]), seed=rng.randrange(1 << 30))
        if kind == "topk":
            params["top_k"] = rng.choice([1, 5, 40])
        elif kind == "topp":
            params["top_p"] = rng.choice([0.5, 0.9])
        elif kind == "minp":
            params["min_p"] = 0.05
        elif kind == "penalties":
            params.update(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7)
        elif kind == "bias":
            params["logit_bias"] = {rng.randrange(3, vocab): 5.0, 2: -3.0}
        if constraint == "regex":  # masks that change with every token
            params["structured_outputs"] = StructuredOutputs(regex="[a-e]+( [a-e]+)*[.]")
        elif constraint == "choice":
            params["structured_outputs"] = StructuredOutputs(choice=["abc", "bad cab", "e"])
        elif constraint == "allowed":
            params["allowed_token_ids"] = rng.sample(range(3, vocab), 8) + [2]
        elif constraint == "bad_words":
            params["bad_words"] = ["e", "ta", "o a"]
        if rng.random() < 0.3:
            params["stop_token_ids"] = [rng.randrange(3, vocab) for _ in range(20)]
        if rng.random() < 0.3:
            params["min_tokens"] = min(params["max_tokens"], 4)
        if rng.random() < 0.2:
            params["logprobs"] = 3
        if rng.random() < 0.2:  # byte-level vocabulary: single letters do occur
            params["stop"] = rng.sample(["e", "t", "a", "o", "xy"], 2)
        abort_after = rng.randint(1, 6) if rng.random() < 0.15 else None
        work.append((f"r{i}", prompt, SamplingParams(**params), abort_after))
    return work


async def _serve(loop: StepLoop, work):
    results = {}

    async def consume(request_id, collector, abort_after):
        tokens, logprobs, reason, stop_reason, text = [], [], None, None, ""
        while True:
            update = await collector.get()
            tokens += update.token_ids
            logprobs += [(lp.token_id, round(lp.logprob, 4)) for lp in update.logprobs]
            text += update.text
            if abort_after is not None and len(tokens) >= abort_after and not update.finished:
                loop.abort(request_id)
            if update.finished:
                reason, stop_reason = update.finish_reason, update.stop_reason
                break
        results[request_id] = (tokens, logprobs, reason, stop_reason, text)

    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        async with anyio.create_task_group() as consumers:
            for request_id, prompt, params, abort_after in work:
                collector = loop.add(request_id, prompt, params)
                consumers.start_soon(consume, request_id, collector, abort_after)
        loop.stop()
    return results


def _run(tiny, work, depth: int, caching: bool, shadow_rate: float = 0.0):
    config, _ = resolve(
        async_depth=depth,
        enable_prefix_caching=caching,
        # 30 blocks of 4 tokens (2 layers x K,V x 4 tokens x 32 floats x 4 bytes = 2 KiB each):
        # the longest request fits, sixteen running ones do not, so preemptions happen.
        kv_cache_memory=30 * 2048,
        block_size=4,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        max_model_len=128,
    )
    _, scheduler, backend, _ = build_parts(config, tiny)
    loop = StepLoop(
        scheduler,
        backend,
        tiny.tokenizer,
        async_depth=depth,
        shadow_rate=shadow_rate,
        vocab_size=tiny.config.vocab_size,
    )
    results = anyio.run(_serve, loop, work)
    if shadow_rate:
        assert loop.shadow.num_checks > 20 and loop.shadow.num_mismatches == 0
    scheduler.check_invariants()
    assert scheduler.num_used_blocks == 0 and not scheduler.requests
    backend.close()
    return results, scheduler.num_preemptions, scheduler.pool.num_hit_tokens


@pytest.fixture(scope="module")
def workload(tiny):
    work = _workload(tiny.config.vocab_size, seed=11)
    assert any(params.stop for _, _, params, _ in work)
    assert sum(params.structured_outputs is not None for _, _, params, _ in work) >= 10
    return work


@pytest.fixture(scope="module")
def sync_runs(tiny, workload):
    return {caching: _run(tiny, workload, 1, caching) for caching in (True, False)}


@pytest.mark.parametrize("caching", [True, False])
def test_depth2_equals_depth1(tiny, workload, sync_runs, caching):
    sync, preempt1, _ = sync_runs[caching]
    overlapped, preempt2, hits = _run(tiny, workload, 2, caching, shadow_rate=0.5)
    assert preempt1 + preempt2 > 0, "the KV budget should force preemptions"
    if caching:
        assert hits > 0
    _assert_same(workload, sync, overlapped)
    stopped_by_string = [r for r in sync.values() if isinstance(r[3], str)]
    assert stopped_by_string


def test_prefix_caching_changes_no_output(workload, sync_runs):
    _assert_same(workload, sync_runs[True][0], sync_runs[False][0])


def _assert_same(work, sync, overlapped):
    for request_id, _prompt, _params, abort_after in work:
        a, b = sync[request_id], overlapped[request_id]
        if abort_after is None:
            assert a == b, request_id
        else:  # an abort lands at a different step; what both produced must agree
            n = min(len(a[0]), len(b[0]))
            assert n >= min(abort_after, 1) and a[0][:n] == b[0][:n], request_id
            assert a[2] in ("abort", "stop", "length") and b[2] in ("abort", "stop", "length")
