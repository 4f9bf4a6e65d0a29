"""The offline API: typed errors that leave nothing behind, seeds, n, logprobs, stops."""

import pytest

from vtllm import LLM, SamplingParams
from vtllm.engine.build import resolved_dtype
from vtllm.errors import ContextLengthExceeded, InvalidParameter, ModelLoadError
from vtllm.models.synthetic import write_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("api"), "tiny", seed=5)
    return LLM(str(path), max_model_len=64, kv_cache_memory=1 << 20, block_size=4)


def _baseline(llm):
    assert llm.scheduler.num_used_blocks == 0 and not llm.scheduler.requests


@pytest.mark.parametrize(
    ("prompt", "params", "error", "param"),
    [
        (list(range(3, 70)), SamplingParams(max_tokens=1), ContextLengthExceeded, "prompt"),
        ([5, 6], SamplingParams(max_tokens=63), ContextLengthExceeded, "max_tokens"),
        ([5, 600], SamplingParams(), InvalidParameter, "prompt"),
        ([5, -1], SamplingParams(), InvalidParameter, "prompt"),
        ([], SamplingParams(), InvalidParameter, "prompt"),
        ([5], SamplingParams(logit_bias={9999: 1.0}), InvalidParameter, "logit_bias"),
    ],
)
def test_bad_requests_raise_typed_errors_and_leak_nothing(llm, prompt, params, error, param):
    with pytest.raises(error) as info:
        llm.generate([[5, 6, 7], prompt], params)
    assert info.value.param == param
    _baseline(llm)
    out = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"max_tokens": 0},
        {"n": True},
        {"min_tokens": 5, "max_tokens": 2},
        {"stop": [""]},
        {"top_k": -5},
    ],
)
def test_invalid_sampling_values(kwargs):
    with pytest.raises(InvalidParameter):
        SamplingParams(**kwargs)


def test_missing_model_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError):
        LLM(str(tmp_path / "nope.gguf"))


def test_bf16_kv_cache_is_refused_on_the_cpu(tmp_path):
    directory = write_checkpoint(tmp_path / "m", "tiny", seed=1)
    with pytest.raises(InvalidParameter, match="kv_cache_dtype bfloat16 runs on the cuda"):
        LLM(str(directory), kv_cache_dtype="bfloat16")
    LLM(str(directory), kv_cache_dtype="float32", max_model_len=64).close()


def test_auto_dtypes_are_bf16_on_cuda_and_float32_on_the_cpu(tmp_path):
    assert resolved_dtype("auto", "cuda") == "bfloat16"
    assert resolved_dtype("auto", "cpu") == "float32"
    assert resolved_dtype("float32", "cuda") == "float32"
    directory = write_checkpoint(tmp_path / "m", "tiny", seed=1)
    LLM(str(directory), kv_cache_dtype="auto", matmul_input_dtype="auto", max_model_len=64).close()


def test_bf16_matmul_inputs_are_refused_on_the_cpu(tmp_path):
    directory = write_checkpoint(tmp_path / "m", "tiny", seed=1)
    with pytest.raises(InvalidParameter, match="matmul_input_dtype bfloat16 runs on the cuda"):
        LLM(str(directory), matmul_input_dtype="bfloat16")


def test_seed_gives_same_tokens_and_n_gives_distinct_children(llm):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=12, ignore_eos=True, n=3)
    first = llm.generate([7, 8, 9], params)[0]
    again = llm.generate([7, 8, 9], params)[0]
    ids = [c.token_ids for c in first.outputs]
    assert ids == [c.token_ids for c in again.outputs]
    assert len({tuple(i) for i in ids}) == 3
    _baseline(llm)


def test_logprobs_and_stop_token(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)
    out = llm.generate([4, 5, 6], greedy)[0].outputs[0]
    assert len(out.logprobs) == 8
    for token, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == token and lp.rank == 1 and lp.top_ids[0] == token
        assert len(lp.top_ids) == 3 and lp.logprob <= 0
    stop_at = out.token_ids[3]
    stopped = llm.generate(
        [4, 5, 6], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop_at])
    )[0].outputs[0]
    first = out.token_ids.index(stop_at)
    assert stopped.token_ids == out.token_ids[: first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at


def test_one_sampling_params_per_prompt(llm):
    """vLLM's form: a list of SamplingParams as long as the prompts, each for its prompt."""
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    long = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1)
    out = llm.generate([[4, 5, 6], [7, 8]], [short, long])
    assert [len(o.outputs[0].token_ids) for o in out] == [2, 5]
    assert out[0].outputs[0].logprobs is None and len(out[1].outputs[0].logprobs) == 5
    assert out[1].outputs[0].token_ids == llm.generate([7, 8], long)[0].outputs[0].token_ids
    for params in ([short], [short, long, short]):
        with pytest.raises(ValueError, match="one per prompt"):
            llm.generate([[4, 5, 6], [7, 8]], params)
    _baseline(llm)


def test_prompt_logprobs_cover_the_prompt_whatever_the_chunking(llm, tmp_path):
    prompt = list(range(5, 45))
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2)
    whole = llm.generate(prompt, params)[0].prompt_logprobs
    path = write_checkpoint(tmp_path, "tiny", seed=5)
    chunked_llm = LLM(
        str(path),
        max_model_len=64,
        kv_cache_memory=1 << 20,
        block_size=4,
        max_num_batched_tokens=16,
    )
    chunked = chunked_llm.generate(prompt, params)[0].prompt_logprobs
    assert whole[0] is None and len(whole) == len(prompt)
    assert [p.token_id for p in whole[1:]] == prompt[1:]
    assert all(p.logprob <= 0 and p.rank >= 1 and len(p.top_ids) == 2 for p in whole[1:])
    assert whole == chunked
