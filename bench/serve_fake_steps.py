"""`vtllm serve` on the CPU backend with each model step replaced by a sleep and made-up
tokens: the host's serving path alone (scheduler, detokenizer, SSE, HTTP) at a GPU-like step
rate, on any machine. From the repo root:
    .venv/bin/python -m bench.serve_fake_steps 0.005 serve --port 8911 --max-num-seqs 64 \
        --max-model-len 4096 --log-level warning &
    .venv/bin/python loadtest/bench_serve.py --base-url http://127.0.0.1:8911 \
        --endpoint completions --input-len 128 --output-len 64 --ignore-eos --temperature 0 \
        --token-count usage --seed 1 --no-keepalive --num-prompts 256 --warmup 64 \
        --max-concurrency 64
The first argument is the step time in seconds; the rest are vtllm's. The CPU backend's launch
is a hand-off to its worker thread, so the CUDA runner's own launch cost is not in it. To compare
two trees, start each from its own root: `python -m` puts the current folder first on sys.path,
so each imports its own vtllm rather than the installed (editable) checkout's.
/metrics' vt:event_loop_cpu_seconds over vt:generation_tokens between two scrapes is the event
loop's CPU a token, steadier than throughput on a shared box. Each full garbage collection
prints its length to stderr ("gc: full collection N ms"): the pauses every stream shares."""

import gc
import sys
import time

from vtllm.executor import runner
from vtllm.scheduler.plan import SampledToken, StepResult

STEP_SECONDS = float(sys.argv.pop(1))


def execute(self, plan):
    self.apply(plan)  # the slot bookkeeping a real step does
    time.sleep(STEP_SECONDS)
    sampled = [
        SampledToken(c.slot, 1000 + (plan.step_id + c.slot) % 300, None)
        for c in plan.chunks
        if c.sample
    ]
    return StepResult(plan.step_id, sampled)


runner.ModelRunner.execute = execute
_gc_started = [0.0]


def _time_full_collections(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        ms = 1e3 * (time.perf_counter() - _gc_started[0])
        print(f"gc: full collection {ms:.1f} ms", file=sys.stderr, flush=True)


gc.callbacks.append(_time_full_collections)

from vtllm.__main__ import main  # noqa: E402  (after the patch, as the server imports it)

sys.exit(main(sys.argv[1:]))
