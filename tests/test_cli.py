"""The command line: one-line errors with exit code 2, --version and --help, the kernel compile
log, and the README's knob table."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vtllm import __version__, config
from vtllm.cli.show_config import knob_table_markdown
from vtllm.cli.warmup import KernelCompileLog
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
        (["generate", "/nonexistent/model.gguf", "--prompt", "x"], "/nonexistent"),
        (["serve", "a.gguf", "--model", "b.gguf"], "two models given"),
        (["warmup", "/nonexistent/model.gguf"], "/nonexistent"),
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


def test_version():
    done = _vtllm("--version")
    assert done.returncode == 0 and done.stdout.strip() == __version__


def test_several_served_model_names():
    """`--served-model-name A B` as vLLM takes it, or "A,B" in the variable; the first leads."""
    import argparse

    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    args = parser.parse_args(["--served-model-name", "a", "b"])
    cfg, _ = config.resolve({"served_model_name": args.served_model_name}, env={})
    assert cfg.served_model_names == ("a", "b")
    cfg, _ = config.resolve(env={"VT_SERVED_MODEL_NAME": "x, y"})
    assert cfg.served_model_names == ("x", "y")
    assert config.resolve(env={})[0].served_model_names == ()


def test_every_knob_has_one_help_group():
    grouped = [name for _, names in config.FLAG_GROUPS for name in names]
    assert sorted(grouped) == sorted(k.name for k in config.KNOBS)


def test_help_reads_well():
    top = _vtllm("--help")
    assert top.returncode == 0
    for command in ("serve", "generate", "warmup", "bench", "synth", "config"):
        assert f"    {command} " in top.stdout
    assert "vtllm serve path/to/model.gguf" in top.stdout  # the examples
    serve = _vtllm("serve", "--help")
    assert serve.returncode == 0
    assert serve.stdout.startswith("usage: vtllm serve [MODEL] [options]\n")
    for title, _ in config.FLAG_GROUPS:
        assert f"\n{title}:\n" in serve.stdout
    assert "--max-model-len N " in serve.stdout and "VT_MAX_MODEL_LEN, default 4096" in serve.stdout
    generate = _vtllm("generate", "--help")
    assert "\nHTTP server:\n" not in generate.stdout and "--port" not in generate.stdout


def test_compile_log_says_once_per_family(caplog):
    import numba

    @numba.njit
    def tiny(x):
        return x + 1

    with caplog.at_level("INFO", logger="vtllm.kernels"), KernelCompileLog() as compiled:
        tiny(1)
        tiny(2)  # compiled once
    lines = [r.getMessage() for r in caplog.records]
    family = __name__.rsplit(".", 1)[-1]
    assert "this happens once" in lines[0]
    assert lines[1].startswith(f"compiled {family}: 1 kernel in ")
    assert lines[2].startswith("compiled 1 kernel in ")
    assert compiled.kernels == 1
    caplog.clear()
    with caplog.at_level("INFO", logger="vtllm.kernels"), KernelCompileLog():
        tiny(3)  # nothing new to compile: nothing said
    assert caplog.records == []


def test_kernel_tables_are_not_imported_before_the_compile_phase():
    """kernels.cpu compiles its kernels on import: a module the start imports before its
    compile phase must not pull it in, or the compile goes unlogged and uncounted."""
    code = (
        "import sys, vtllm.cli.serve, vtllm.cli.warmup, vtllm.engine.build, vtllm.server.app, "
        "vtllm.executor.runner, vtllm.executor.backend; "
        "print(sorted(m for m in sys.modules if m.startswith('vtllm.kernels.cpu')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_warmup_fills_the_cache_and_says_how_long(tmp_path):
    done = _vtllm("warmup", "--kv-cache-memory", "16M", "--max-model-len", "256")
    assert done.returncode == 0, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "done in" in last and "load" in last and "compile" in last, done.stderr
