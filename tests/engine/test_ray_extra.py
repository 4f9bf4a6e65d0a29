"""Without the ray extra, --distributed-executor-backend ray is one line and exit code 2, before
any model loads (make test runs without Ray; the Ray tests live in tests/distributed)."""

import subprocess
import sys

HIDE_RAY = (
    "import sys; sys.modules['ray'] = None; from vtllm.__main__ import main; sys.exit(main())"
)


def test_missing_ray_extra_is_one_line_and_exit_2():
    args = ["generate", "--prompt", "x", "--distributed-executor-backend", "ray"]
    r = subprocess.run(
        [sys.executable, "-c", HIDE_RAY, *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert errors == ["vtllm: error: the ray backend needs Ray: pip install 'vtllm[ray]'"], r.stderr
