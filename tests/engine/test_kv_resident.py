"""The CPU KV resident cap: its default, its wiring, and that reusing blocks changes no output."""

from types import SimpleNamespace

import pytest

from vtllm import LLM, SamplingParams
from vtllm.executor.kv_cache import bytes_per_block, resident_kv_blocks
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint


def test_default_cap_is_llama_server_f16_kv_for_one_context():
    mc = SimpleNamespace(num_layers=30, kv_size=192)  # SmolLM2-135M
    for context in (512, 4096):
        cap = resident_kv_blocks(mc, block_size=16, budget_bytes=0, max_model_len=context)
        # f16 K and V for the context's tokens, in float32 blocks of 16: half as many tokens
        assert cap * bytes_per_block(mc, 16) == context * 2 * 30 * 192 * 2
        assert cap * 16 == context // 2
    given = resident_kv_blocks(mc, block_size=16, budget_bytes=10 << 20, max_model_len=4096)
    assert given == (10 << 20) // bytes_per_block(mc, 16)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(str(write_checkpoint(tmp_path_factory.mktemp("resident"), "tiny", seed=3)))


def _serve_one_at_a_time(llm, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]


def test_capped_pool_reuses_blocks_and_matches_uncapped_outputs(model):
    kw = dict(loaded_model=model, max_model_len=64, kv_cache_memory=1 << 20, block_size=4)
    per_block = bytes_per_block(model.config, 4)
    capped = LLM(kv_cache_resident_memory=8 * per_block, **kw)
    uncapped = LLM(kv_cache_resident_memory=1 << 40, **kw)
    assert capped.scheduler.pool.resident_cap == 8
    assert uncapped.scheduler.pool.resident_cap == uncapped.scheduler.pool.num_usable_blocks
    # Distinct prompts, then the first ones again: hits, or recomputation into reused blocks.
    prompts = [[5 + i, 7 + 2 * i, 9, 11 + i, 13, 2 * i + 3, 17, 19] for i in range(12)]
    prompts += prompts[:3] + [prompts[0] + [23, 29, 31]]
    out_capped = _serve_one_at_a_time(capped, prompts)
    out_uncapped = _serve_one_at_a_time(uncapped, prompts)
    assert out_capped == out_uncapped
    assert capped.scheduler.pool.num_resident_blocks == 8
    assert uncapped.scheduler.pool.num_resident_blocks > 8
    for llm in (capped, uncapped):
        llm.close()
