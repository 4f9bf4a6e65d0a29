"""The default model (SmolLM2) copies a text it is asked to repeat, so prompt lookup proposes
the right tokens most of the time there: greedy output with speculation is the same, and most
drafts are accepted (one short generation: tokens are slow on this model)."""

import pytest

from vtllm import LLM, SamplingParams

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}  # fmt: skip
TEXT = "The keeper climbed the stairs at six, counted a hundred and twelve steps, lit the lamp."


@pytest.fixture(scope="module")
def engines():
    plain = LLM()
    spec = LLM(loaded_model=plain.loaded, speculative_config=SPEC)
    yield plain, spec
    spec.close()
    plain.close()


def test_copying_is_accepted_and_changes_nothing(engines):
    plain, spec = engines
    prompt = plain.render_chat([{"role": "user", "content": f"Repeat exactly: {TEXT}"}])
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1)
    (a,), (b,) = plain.generate([prompt], params), spec.generate([prompt], params)
    assert b.outputs[0].token_ids == a.outputs[0].token_ids
    assert b.outputs[0].text == a.outputs[0].text
    assert [lp.logprob for lp in b.outputs[0].logprobs] == [
        lp.logprob for lp in a.outputs[0].logprobs
    ]
    stats = spec.scheduler.spec_stats
    assert stats.num_accepted_tokens >= stats.num_draft_tokens // 2 > 0, stats
    assert spec.loop.num_steps < plain.loop.num_steps
