"""Freeing blocks outside the sliding window changes no bit of any output (real engine).

A tiny random Mistral whose every layer sees 8 tokens, blocks of 4: prompts several windows
long in chunks of 16, a shared prefix (prefix-cache hits), a KV cache of 13 blocks that forces
preemptions and that a 228-token request could not fit without freeing. Greedy tokens and
their top-5 logprobs (float bits of the logits' log-softmax) must equal those of a run that
keeps every block, at depth 1 and 2; the runner's tables point freed entries at the null
block, so a kernel reading before a window would change them.
"""

import json
import random

import anyio
import pytest
from msgspec.structs import replace

from tests.engine.test_depth2_law import _serve
from tests.models import phi3_tiny
from vtllm.config import resolve
from vtllm.engine.build import build_parts
from vtllm.engine.loop import StepLoop
from vtllm.executor.kv_cache import bytes_per_block
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler

WINDOW, BLOCK = 8, 4


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    directory = tmp_path_factory.mktemp("window")
    config = {**phi3_tiny.CONFIGS["mistral"], "sliding_window": WINDOW}
    save_safetensors(directory / "model.safetensors", phi3_tiny.tensors("mistral"))
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = byte_tokenizer_json(config["vocab_size"])
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    return load_model(directory)


def _work(vocab: int):
    rng = random.Random(3)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    work = []
    for i, (n, max_tokens) in enumerate(
        [(48, 180), (6, 24), (9, 30), (5, 20), (60, 12), (33, 26), (8, 16), (17, 8)]
    ):
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        if i in (1, 3, 6):
            prompt = shared + prompt  # prefix-cache hits
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
        work.append((f"r{i}", prompt, params, None))
    return work


def _run(model, work, *, depth: int, freeing: bool, num_blocks: int, caching: bool):
    config, _ = resolve(
        async_depth=depth,
        enable_prefix_caching=caching,
        kv_cache_memory=num_blocks * bytes_per_block(model.config, BLOCK),
        block_size=BLOCK,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=256,
    )
    _, scheduler, backend, _ = build_parts(config, model)
    assert scheduler.config.sliding_window == WINDOW  # every layer of a Mistral is windowed
    if not freeing:
        scheduler = Scheduler(replace(scheduler.config, sliding_window=0))
    released = []
    schedule = scheduler.schedule

    def schedule_and_count():
        plan = schedule()
        if plan is not None and plan.released_blocks:
            released.append(sum(plan.released_blocks.values()))
        return plan

    scheduler.schedule = schedule_and_count
    loop = StepLoop(
        scheduler,
        backend,
        model.tokenizer,
        async_depth=depth,
        shadow_rate=0.5 if depth == 2 else 0.0,
        vocab_size=model.config.vocab_size,
    )
    results = anyio.run(_serve, loop, work)
    if depth == 2:
        assert loop.shadow.num_checks > 20 and loop.shadow.num_mismatches == 0
    scheduler.check_invariants()
    assert scheduler.num_used_blocks == 0 and not scheduler.requests
    backend.close()
    return results, scheduler, released


@pytest.fixture(scope="module")
def work(mistral):
    return _work(mistral.config.vocab_size)


@pytest.fixture(scope="module")
def kept(mistral, work):
    """Every block kept for the request's life: 80 blocks, no preemption, no cache."""
    results, scheduler, released = _run(
        mistral, work, depth=1, freeing=False, num_blocks=80, caching=False
    )
    assert not released and scheduler.num_preemptions == 0
    return results


@pytest.mark.parametrize("depth", [1, 2])
def test_freeing_changes_no_bit(mistral, work, kept, depth):
    freed, sched, released = _run(
        mistral, work, depth=depth, freeing=True, num_blocks=14, caching=True
    )
    assert sched.num_preemptions > 0 and sched.pool.num_hit_tokens > 0
    longest = max(len(prompt) + params.max_tokens for _, prompt, params, _ in work)
    assert sched.pool.num_usable_blocks * BLOCK < longest // 4  # a quarter of the longest
    assert len(released) > 50
    for request_id, _prompt, params, _ in work:
        tokens, logprobs, reason, _, _ = freed[request_id]
        assert len(tokens) == params.max_tokens and reason == "length"
        assert freed[request_id] == kept[request_id], request_id
