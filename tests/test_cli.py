"""The command line: one-line errors with exit code 2, and the README's knob table."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vtllm.cli.show_config import knob_table_markdown
from vtllm.models.loader import load_model

ROOT = Path(__file__).resolve().parents[1]


def _vtllm(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "vtllm", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=env,
    )


def test_readme_knob_table_is_generated_from_config():
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- knobs:start -->\n(.*)<!-- knobs:end -->", readme, re.S).group(1)
    assert table == knob_table_markdown()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["generate", "--model", "/nonexistent/model.gguf", "--prompt", "x"], "/nonexistent"),
        (["generate", "--prompt", "x", "--temperature", "nan"], "temperature"),
        (["generate", "--prompt", "x", "--max-tokens", "0"], "max_tokens"),
        (["config", "--max-num-seqs", "0"], "max-num-seqs"),
        (["generate", "--prompt", "x", "--max-model-len", "32", "--max-tokens", "40"], "context"),
        (["synth", "--shape", "tiny", "--out", "/tmp/never-written", "--layers", "0"], "layers"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, needle):
    done = _vtllm(*args)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("vtllm: error")]
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_corrupt_and_foreign_files(tmp_path):
    truncated = tmp_path / "cut.gguf"
    from vtllm.models.default_model import default_model_path

    truncated.write_bytes(default_model_path().read_bytes()[: 5 << 20])
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    for path in (truncated, not_gguf):
        done = _vtllm("generate", "--model", str(path), "--prompt", "x")
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert str(path) in done.stderr


def test_synth_layers_override(tmp_path):
    done = _vtllm("synth", "--shape", "tiny", "--out", str(tmp_path / "m"), "--layers", "1")
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    assert load_model(str(tmp_path / "m")).config.num_layers == 1  # and no tensors of layer 1


def test_synth_writes_a_gguf_copy_when_asked(tmp_path):
    done = _vtllm("synth", "--shape", "tiny-qwen3", "--out", str(tmp_path / "m"), "--gguf")
    assert done.returncode == 0, done.stderr
    loaded = load_model(str(tmp_path / "m" / "model-f16.gguf"))
    assert loaded.config.architecture == "qwen3" and loaded.config.qk_norm
