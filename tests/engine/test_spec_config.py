"""--speculative-config: vLLM's JSON shape, checked field by field with one clear line."""

import pytest

from vtllm.__main__ import main
from vtllm.config import parse_speculative_config, resolve
from vtllm.errors import InvalidParameter


def test_ngram_config_and_vllm_defaults():
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4}')
    assert (spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        4,
        5,
        5,
    )
    spec = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    )
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (3, 3)
    assert parse_speculative_config(None) is None


def test_llm_takes_a_dict_and_the_environment_a_string():
    config, sources = resolve(
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        },  # fmt: skip
    )
    assert config.speculative.prompt_lookup_max == 4 and sources["speculative_config"]
    env = {"VT_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 1}'}
    assert resolve(env=env)[0].speculative.num_speculative_tokens == 1
    with pytest.raises(InvalidParameter, match="^VT_SPECULATIVE_CONFIG: num_speculative"):
        resolve(env={"VT_SPECULATIVE_CONFIG": '{"method": "ngram"}'})


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be"),
        ('{"method": "ngram", "num_speculative_tokens": true}', "must be an integer"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of"),
        ('{"num_speculative_tokens": 2}', "method must be one of"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', "unknown field 'k'"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
            '"prompt_lookup_max": 2}',
            r"prompt_lookup_min \(4\) must not exceed prompt_lookup_max \(2\)",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}', ">= 1"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "model must name the draft"),
        (
            '{"method": "draft_model", "model": "d", "num_speculative_tokens": 2, '
            '"prompt_lookup_max": 2}',
            "unknown field 'prompt_lookup_max' for method draft_model",
        ),
        ("{method: ngram}", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_configs_fail_naming_the_field(text, message):
    with pytest.raises(InvalidParameter, match=message) as info:
        parse_speculative_config(text)
    assert info.value.param == "speculative_config" and "\n" not in str(info.value)


def test_cli_exits_2_with_one_line(capsys):
    bad = (
        '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, '
        '"prompt_lookup_max": 1}'
    )
    assert main(["serve", "--speculative-config", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("vtllm: error: --speculative-config: ")
