"""A server's resident memory while it serves: start a server command, wait for /health, run
waves of 16 concurrent streamed chat completions, and print its VmRSS / VmHWM (from
/proc/PID/status) when ready and after each wave, with the resident set split by mapping.

    python -m bench.serve_memory [--waves 4] [--port 8131] -- vtllm serve --port PORT
    python -m bench.serve_memory -- .peers-build/build/bin/llama-server -m MODEL.gguf \\
        --host 127.0.0.1 --port PORT -t 2 -tb 2

PORT in the command is replaced by --port. A wave: one-line poem prompts, max_tokens 64,
temperature 0.7, seeded, so both servers stream ~64 tokens a request. Memory does not depend
on the machine's load, so other work beside it changes little (waves vary by a few MiB with
which requests share a step). Linux only.
"""

import argparse
import collections
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

TOPICS = (
    "the sea", "autumn", "a robot", "coffee", "mountains", "a city at night", "rain", "a cat",
    "the moon", "a library", "trains", "snow", "a garden", "the desert", "music", "friendship",
)  # fmt: skip


def resident_by_mapping(pid: int) -> dict[str, float]:
    """MiB of Rss per kind of mapping: LLVM's library, GGUF files, other files, heap, anon."""
    kinds: collections.Counter = collections.Counter()
    kind = "anon"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                name = parts[5] if len(parts) > 5 else ""
                if "libllvmlite" in name:
                    kind = "llvm"
                elif name.endswith(".gguf"):
                    kind = "gguf"
                elif name.startswith("/"):
                    kind = "files"
                else:
                    kind = "heap" if name == "[heap]" else "anon"
            elif parts[0] == "Rss:":
                kinds[kind] += int(parts[1]) / 1024
    return kinds


def report(label: str, pid: int) -> None:
    with open(f"/proc/{pid}/status") as f:
        status = {
            line.split(":")[0]: int(line.split()[1]) / 1024
            for line in f
            if line.startswith(("VmRSS", "VmHWM"))
        }
    kinds = resident_by_mapping(pid)
    split = " ".join(f"{k} {kinds[k]:.1f}" for k in ("llvm", "gguf", "files", "heap", "anon"))
    print(f"{label:<10} RSS {status['VmRSS']:6.1f}  HWM {status['VmHWM']:6.1f}  | {split}")


def stream_one(base: str, model: str, topic: str, seed: int) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a short poem about {topic}."}],
        "max_tokens": 64,
        "temperature": 0.7,
        "seed": seed,
        "stream": True,
    }
    chunks = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
    return chunks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("command", nargs="+", help="the server command (PORT: --port)")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    command = [a.replace("PORT", str(args.port)) for a in args.command]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit("the server did not become healthy")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        report("ready", server.pid)
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        for wave in range(args.waves):
            with ThreadPoolExecutor(len(TOPICS)) as pool:
                jobs = [
                    pool.submit(stream_one, base, model, topic, 100 * wave + i)
                    for i, topic in enumerate(TOPICS)
                ]
                chunks = sum(job.result() for job in jobs)
            report(f"wave {wave}", server.pid)
            print(f"           ({chunks} streamed chunks)")
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
