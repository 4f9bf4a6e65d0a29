"""Our side of bench.gpu: the CUDA runner's decode step and time to first token.

The runner is driven with StepPlans directly (no scheduler), as the engine would drive it:
max_batch requests are prefilled once with `context`-token prompts, each on its own blocks;
decode at batch B then steps the first B of them. A decode figure is taken two ways:
- step_ms: steps launched at depth 2 (the next step enqueued before the last one is read),
  wall time per step: what a serving loop gets, host work included where it is not hidden;
- gpu_ms: the step's CUDA graph replayed back to back, timed with CUDA events: the GPU alone.
TTFT is one prompt through the runner, synchronised, median of 3 after a warm-up.
"""

import gc
import statistics
import time

import numpy as np

from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


def offline_c1_ms(loaded, *, knobs=None, prompt_len=16, decode_len=128, repeats=3) -> float:
    """c1 decode ms/token through the offline API (scheduler, depth 2, graphs), as `bench
    latency` measures it: between a request's first and last token, median of repeats."""
    from vtllm.cli.bench import bench_latency
    from vtllm.llm import LLM

    llm = LLM(
        str(loaded.path),
        loaded_model=loaded,
        device="cuda",
        max_num_seqs=8,
        enable_prefix_caching=False,
        max_model_len=4096,
        **(knobs or {}),
    )
    try:
        llm.warm_up()
        report = bench_latency(llm, prompt_len, decode_len, repeats)
    finally:
        llm.close()
    del llm
    gc.collect()  # the engine's device buffers go before the runner below allocates its own
    return 1e3 / report["decode_tok_s"]["median"]


class Bench:
    """A runner with max_batch seated requests and the bookkeeping to step them."""

    def __init__(
        self,
        loaded,
        *,
        max_batch: int,
        context: int,
        longest_prompt: int,
        headroom: int,
        knobs: dict,
    ):
        from vtllm.executor.cuda_runner import CudaModelRunner
        from vtllm.executor.kv_cache import bytes_per_block

        c = loaded.config
        self.vocab, self.context = c.vocab_size, context
        self.per_slot = -(-(context + headroom) // BLOCK)
        need = max(max_batch * self.per_slot, -(-(longest_prompt + 1) // BLOCK)) + 1
        self.max_tokens = max(longest_prompt, context)
        self.runner = CudaModelRunner(
            loaded,
            block_size=BLOCK,
            max_num_seqs=max_batch,
            max_model_len=max(context + headroom, longest_prompt + 1),
            max_num_batched_tokens=self.max_tokens,
            kv_cache_memory=need * bytes_per_block(c, BLOCK),
            kv_cache_fraction=0.0,
            use_graphs=True,
            **knobs,
        )
        if self.runner.num_blocks < need:  # block ids below are assigned by hand
            raise RuntimeError(f"KV cache holds {self.runner.num_blocks} blocks, need {need}")
        self.max_batch = max_batch
        self.pos = np.zeros(max_batch, np.int64)  # per slot: the next token index to compute
        self.step_id = 0
        self.rng = np.random.default_rng(0)

    def _prompt(self, n: int) -> list[int]:
        return self.rng.integers(100, self.vocab, n).tolist()

    def _plan(self, seated, chunks, freed=()) -> StepPlan:
        self.step_id += 1
        return StepPlan(self.step_id, list(seated), list(chunks), list(freed))

    def prefill_all(self) -> None:
        """Seats every slot with a context-token prompt, as many per step as the budget holds."""
        per_step = max(1, self.max_tokens // self.context)
        for first in range(0, self.max_batch, per_step):
            slots = range(first, min(first + per_step, self.max_batch))
            seated = [
                SeatedRequest(
                    i,
                    self._prompt(self.context),
                    self.context,
                    GREEDY,
                    0,
                    list(range(i * self.per_slot, (i + 1) * self.per_slot)),
                )
                for i in slots
            ]
            chunks = [Chunk(i, 0, self.context, [], sample=True) for i in slots]
            self.runner.execute(self._plan(seated, chunks))
        self.pos[:] = self.context  # the sampled token sits at index context

    def decode_plan(self, batch: int) -> StepPlan:
        chunks = [Chunk(i, int(self.pos[i]), 1, [], sample=True) for i in range(batch)]
        self.pos[:batch] += 1
        return self._plan((), chunks)

    def decode(self, batch: int, steps: int) -> dict:
        """Depth-2 wall time per step and the graph's GPU time, at the slots' context."""
        r = self.runner
        for _ in range(3):  # compiles, captures the bucket's graph
            r.execute(self.decode_plan(batch))
        context = float(self.pos[:batch].mean()) + steps / 2
        started = time.perf_counter()
        pending = r.launch(self.decode_plan(batch))
        for _ in range(steps - 1):
            following = r.launch(self.decode_plan(batch))
            r.finish(pending)
            pending = following
        r.finish(pending)
        step_ms = 1e3 * (time.perf_counter() - started) / steps
        bucket = next(b for b in r.buckets if b >= batch)
        gpu_ms = graph_ms(r.stream, r.graphs[bucket])
        return {"step_ms": step_ms, "gpu_ms": gpu_ms, "context": context, "bucket": bucket}

    def ttft_ms(self, n: int, repeats: int = 3, *, graphs: bool = True) -> float:
        """One n-token prompt in slot 0 (every slot freed first), prefill and the first
        sampled token, synchronised; median of repeats after a warm-up (which captures the
        step's graph). graphs=False runs the step eagerly, one Python launch per kernel."""
        before, self.runner.use_graphs = self.runner.use_graphs, graphs
        times = []
        for i in range(repeats + 1):
            seat = SeatedRequest(
                0, self._prompt(n), n, GREEDY, 0, list(range(-(-(n + 1) // BLOCK)))
            )
            plan = self._plan([seat], [Chunk(0, 0, n, [], sample=True)], range(self.max_batch))
            started = time.perf_counter()
            self.runner.execute(plan)
            if i:
                times.append(1e3 * (time.perf_counter() - started))
        self.runner.use_graphs = before
        return statistics.median(times)

    def close(self) -> None:
        self.runner.close()
        del self.runner
        gc.collect()


def graph_ms(stream, graph, reps: int = 10, rounds: int = 10) -> float:
    """Median per replay of a graph launched reps times between two CUDA events."""
    from numba import cuda

    graph.replay()
    stream.synchronize()
    times = []
    for _ in range(rounds):
        a, b = cuda.event(), cuda.event()
        a.record(stream)
        for _ in range(reps):
            graph.replay()
        b.record(stream)
        b.synchronize()
        times.append(cuda.event_elapsed_time(a, b) / reps)
    return statistics.median(times)


def runner_figures(loaded, settings) -> dict:
    """{"decode": {batch: {...}}, "ttft_ms": {prompt_len: ms}, "ttft_eager_ms": {...}}, keys
    as strings (JSON)."""
    # slot 0 steps in every batch size: warm-ups and timed steps, plus one block of slack
    headroom = len(settings.batches) * (settings.steps + 3) + BLOCK
    bench = Bench(
        loaded,
        max_batch=max(settings.batches),
        context=settings.context,
        longest_prompt=max(settings.prompts),
        headroom=headroom,
        knobs=settings.knobs,
    )
    try:
        bench.prefill_all()
        decode = {str(b): bench.decode(b, settings.steps) for b in sorted(settings.batches)}
        ttft = {str(n): bench.ttft_ms(n) for n in settings.prompts}
        eager = {str(n): bench.ttft_ms(n, graphs=False) for n in settings.prompts}
    finally:
        bench.close()
    return {"decode": decode, "ttft_ms": ttft, "ttft_eager_ms": eager}
