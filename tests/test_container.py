"""The CPU image (Containerfile), built and run with podman as a user would run it.

The image is built on a base made here rather than pulled (no registry need be reachable): a
Debian rootfs from debootstrap with python3 and its venv module, imported as BASE_TAG and
kept between runs, as podman keeps the image's layers, so a rerun rebuilds only what changed.
The base trusts the certificate authorities this machine trusts, for pip's downloads from
PyPI through a TLS-inspecting egress proxy.

Then the container is checked from outside: /health 200 from a warm kernel cache (compiled
into the image), /version, the health check, a streamed chat completion, and a stop (the
image's STOPSIGNAL, SIGTERM) while a stream is in flight: the stream ends complete and the
container exits 0.

Needs root (debootstrap, podman's root storage), podman, runc and debootstrap: `apt-get
install podman runc debootstrap`. podman runs with runc, cgroupfs and a containers.conf of its
own without default ulimits, which is what works in an unprivileged VM or container too.
Slow: a first run (debootstrap, the dependencies from PyPI, the kernels' compile) takes
minutes; a rerun after a source change about one.
"""

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import free_port
from vtllm import __version__

ROOT = Path(__file__).resolve().parents[1]
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"  # python3 3.11
BASE_TAG = f"localhost/vtllm-test-base:{SUITE}"
IMAGE_TAG = "localhost/vtllm:cpu-test"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed (apt-get install podman runc debootstrap)",
    ),
]


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(*args, check=True, timeout=900, **kw) -> subprocess.CompletedProcess:
        argv = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", *map(str, args)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, **kw)
        if check:
            assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    run.env = env
    return run


def _build_base(podman, workdir: Path) -> None:
    assert shutil.which("debootstrap"), "debootstrap is not installed (apt-get install debootstrap)"
    rootfs = workdir / "rootfs"
    done = subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates"]
        + [SUITE, str(rootfs), MIRROR],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    host_cas = Path("/etc/ssl/certs/ca-certificates.crt")
    if host_cas.exists():
        shutil.copyfile(host_cas, rootfs / "etc/ssl/certs/ca-certificates.crt")
        (rootfs / "etc/pip.conf").write_text(f"[global]\ncert = {host_cas}\n")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / cache).glob("*"):
            if f.is_file():
                f.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    podman("import", "--change", f"ENV PATH={PATH}", "-", BASE_TAG, stdin=tar.stdout)
    assert tar.wait() == 0


@pytest.fixture(scope="module")
def image(podman, tmp_path_factory):
    if podman("image", "exists", BASE_TAG, check=False).returncode != 0:
        _build_base(podman, tmp_path_factory.mktemp("base"))
    old = podman("image", "inspect", "--format", "{{.Id}}", IMAGE_TAG, check=False).stdout.strip()
    started = time.monotonic()
    podman(
        "build", "--format", "docker", "--build-arg", f"BASE_IMAGE={BASE_TAG}",
        "-t", IMAGE_TAG, "-f", ROOT / "Containerfile", ROOT, timeout=1800,
    )  # fmt: skip
    new = podman("image", "inspect", "--format", "{{.Id}}", IMAGE_TAG).stdout.strip()
    if old and old != new:  # the superseded build, not kept for ever
        podman("rmi", old, check=False)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE_TAG).stdout)
    took = time.monotonic() - started
    print(f"\nimage {IMAGE_TAG}: built in {took:.0f}s, {size / 1e6:.0f} MB")  # as podman counts
    return IMAGE_TAG


def _wait_healthy(base: str, podman, name: str, limit: float = 300.0) -> float:
    started = time.monotonic()
    while True:
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert state == "running", podman("logs", name).stderr[-3000:]
        assert time.monotonic() - started < limit, "no /health 200"
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def _stream(base: str, body: dict, seen: threading.Event | None = None) -> dict:
    """A streamed chat completion: its text, finish reason, usage and whether [DONE] came."""
    out = {"text": "", "finish": None, "usage": None, "done": False}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                out["done"] = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                out["usage"] = chunk.get("usage") or out["usage"]
                for choice in chunk["choices"]:
                    out["text"] += choice["delta"].get("content") or ""
                    out["finish"] = choice.get("finish_reason") or out["finish"]
                if seen is not None and out["text"]:
                    seen.set()
    return out


def test_image_serves_and_drains_on_stop(podman, image):
    inspect = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    assert config["User"] == "10001:10001" and config["StopSignal"] == "SIGTERM"
    assert inspect["Healthcheck"]["Test"][0] == "CMD", inspect.get("Healthcheck")
    assert "VT_HOST=0.0.0.0" in config["Env"]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    name = f"vtllm-test-{port}"
    podman(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000",
        "-e", "VT_KV_CACHE_MEMORY=64M", "-e", "VT_DRAIN_TIMEOUT_S=60",
        "--health-interval", "disable", image,
    )  # fmt: skip
    try:
        took = _wait_healthy(base, podman, name)
        print(f"start to /health 200 in the container: {took:.1f}s")
        logs = podman("logs", name)
        log = logs.stdout + logs.stderr
        # The kernels were compiled into the image: this start only loads them.
        assert "compiling the CPU kernels" not in log, log[-3000:]
        assert "(from cache)" in log, log[-3000:]

        assert podman("exec", name, "id", "-un").stdout.strip() == "vtllm"
        assert httpx.get(base + "/version").json() == {"version": __version__}
        assert podman("healthcheck", "run", name, check=False).returncode == 0

        question = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
        short = _stream(base, {**question, "max_tokens": 8, "temperature": 0})
        assert short["done"] and short["text"].strip() and short["usage"]

        # A stop while a stream is in flight: it is drained, not cut.
        seen = threading.Event()
        results, stopped = {}, {}
        long = {**question, "max_tokens": 400, "ignore_eos": True, "temperature": 0}
        reader = threading.Thread(target=lambda: results.update(_stream(base, long, seen)))
        reader.start()
        assert seen.wait(60), "the stream sent nothing"
        stopper = threading.Thread(
            target=lambda: stopped.update(done=podman("stop", "--time", "90", name, timeout=120))
        )
        stopper.start()
        deadline = time.monotonic() + 30
        while httpx.get(base + "/health", timeout=5).status_code == 200:
            assert time.monotonic() < deadline, "SIGTERM did not reach the server"
            time.sleep(0.05)
        draining = reader.is_alive()  # the stop came while the stream was in flight
        refused = httpx.post(base + "/v1/chat/completions", json=question, timeout=30)
        reader.join(60)
        stopper.join(120)
        assert draining and not reader.is_alive() and "done" in stopped
        assert refused.status_code == 503, refused.text
        assert results["done"] and results["finish"] == "length", results
        assert results["usage"]["completion_tokens"] == 400, results
        exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        log = podman("logs", name).stderr
        assert exit_code == "0", log[-3000:]
        assert "shutting down: draining" in log, log[-3000:]
    finally:
        podman("rm", "--force", name, check=False)


def test_stop_during_the_start_ends_it_at_once(podman, image):
    """vtllm is the container's PID 1, which the kernel spares from signals it has no handler
    for: a stop while the model loads or warms up must still end it, not wait for SIGKILL."""
    name = f"vtllm-test-start-{free_port()}"
    podman("run", "-d", "--name", name, "-e", "VT_DEBUG_WARMUP_DELAY_S=120", image)
    try:
        deadline = time.monotonic() + 120
        while "holding the warm-up" not in podman("logs", name).stderr:
            assert time.monotonic() < deadline, podman("logs", name).stderr[-3000:]
            time.sleep(0.2)
        started = time.monotonic()
        podman("stop", "--time", "60", name, timeout=120)
        assert time.monotonic() - started < 30  # not the stop timeout's SIGKILL
        exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert exit_code == "143", podman("logs", name).stderr[-3000:]  # 128 + SIGTERM
        assert "SIGTERM during the start: exiting" in podman("logs", name).stderr
    finally:
        podman("rm", "--force", name, check=False)
