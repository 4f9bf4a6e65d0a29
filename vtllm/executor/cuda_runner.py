"""Executes StepPlans on the GPU: the device token mirror, staged metadata, graphs, sampling.
Hot path: keep it lean, put features in helpers.

A step is enqueued, not waited for: `launch` applies the plan, copies the step's metadata
(one pinned staging buffer, one copy), runs the forward and the sampler on the stream (a
captured graph for decode, prefill and mixed steps alike, padded to a bucket of tokens),
copies the sampled ids to pinned host memory and records an event. `finish` waits for that
event and reads them: one step late with depth 2, while the next step already runs. Input ids
are gathered from the device mirror, which the sampler writes, so the host never sends a token
back.

The id copy stays on the compute stream rather than a side stream: it is a few bytes queued
right after the sampler and before the next step's work, so its event fires as soon as the
step's tokens exist; a side stream would add an event wait, and a guard against the next step
overwriting the sampler's output before the copy, for no gain.
"""

import logging
import time
from dataclasses import dataclass

import numpy as np
from numba import cuda

from vtllm.errors import InvalidParameter
from vtllm.executor.cuda_graphs import CudaGraph, free_device_memory
from vtllm.executor.cuda_model import CudaForward, StepInputs
from vtllm.executor.kv_cache import num_kv_blocks
from vtllm.executor.staging import PromptStaging, StagedSamplingTable
from vtllm.executor.step_layout import (
    extend_block_tables,
    flatten_chunks,
    graph_buckets,
    graph_counts,
    pad_step,
    prompt_logprobs,
    seat_sampling,
)
from vtllm.kernels import cpu as cpu_ops
from vtllm.kernels import cuda as ops
from vtllm.kernels.cuda._kv_cache import KV_DTYPES
from vtllm.kernels.cuda._ptx import GRID_DEPENDENCY
from vtllm.kernels.cuda._ptx_wgmma import WGMMA
from vtllm.kernels.cuda.attention_split import SPLIT
from vtllm.kernels.cuda.gather import gather_rows
from vtllm.kernels.sampling_table import SamplingTable
from vtllm.models.loader import LoadedModel
from vtllm.scheduler.plan import SampledToken, StepPlan, StepResult, TokenLogprobs

log = logging.getLogger("vtllm.cuda")

# how x enters the products with bf16 W on the tensor cores: split into two bf16 (about
# float32's precision) or rounded to one (half the mmas; kernels/cuda/linear_mma.py)
MATMUL_INPUT_DTYPES = ("float32", "bfloat16")

RING = 4  # staging buffers in rotation: more than the steps that can be in flight
_FIELDS = (
    "token_slots",
    "positions",
    "slot_mapping",
    "query_start_loc",
    "seq_lens",
    "block_tables",
    "logits_rows",
    "sample_rows",
    "sample_slots",
    "sample_positions",
)


@dataclass(slots=True)
class PendingStep:
    step_id: int
    chunks: list  # the sampling chunks, in order
    ring: int  # staging slot holding the sampled ids
    event: object
    num_logprobs: list  # per sampling chunk: top logprobs wanted (-1: none), read at launch
    prompt_logprobs: dict


# A step's leading rows whose attention goes through the decode kernels, which spread each
# row's keys over blocks, when VT_CUDA_SPLIT_ATTENTION_ROWS is 0: enough for a serving step's
# prompt chunk beside its decodes, so that the prompt's rows do not queue in the prefill
# kernel after the decodes (attention_ring.split_attention; BENCHMARKS.md, GPU serving), as
# long as the scratch for their split states, which grows with max_model_len, stays under
# SPLIT_SCRATCH_BYTES.
SPLIT_ROWS = 256
SPLIT_SCRATCH_BYTES = 512 << 20


def attention_split_rows(
    config, max_num_seqs: int, max_tokens: int, max_positions: int, knob: int
) -> int:
    """The decode kernels' rows: every decode row (max_num_seqs) and, up to the step's size,
    the knob's rows, or with knob 0 up to SPLIT_ROWS that fit in SPLIT_SCRATCH_BYTES."""
    if knob == 0:
        row_bytes = 4 * config.num_heads * -(-max_positions // SPLIT) * (config.head_dim + 2)
        knob = min(SPLIT_ROWS, SPLIT_SCRATCH_BYTES // row_bytes)
    return min(max_tokens, max(max_num_seqs, knob))


def _check_prefill_gemm(prefill_gemm: str, matmul_input_dtype: str) -> None:
    """wgmma multiplies bf16 inputs only, on Hopper only (gemm_wgmma)."""
    if prefill_gemm not in ("mma", "wgmma"):
        raise InvalidParameter(
            f"cuda_prefill_gemm must be mma or wgmma, got {prefill_gemm!r}",
            param="cuda_prefill_gemm",
        )
    if prefill_gemm == "mma":
        return
    if not WGMMA:
        raise InvalidParameter(
            "cuda_prefill_gemm wgmma needs an sm_90 (Hopper) GPU", param="cuda_prefill_gemm"
        )
    if matmul_input_dtype != "bfloat16":
        raise InvalidParameter(
            "cuda_prefill_gemm wgmma needs matmul_input_dtype bfloat16, "
            f"got {matmul_input_dtype!r}",
            param="cuda_prefill_gemm",
        )


class CudaModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        kv_cache_memory: int,
        kv_cache_fraction: float,
        use_graphs: bool,
        kv_cache_dtype: str = "float32",
        matmul_input_dtype: str = "float32",
        cuda_pdl: bool = True,
        split_attention_rows: int = 0,
        cuda_flash_prefill: bool = False,
        cuda_prefill_gemm: str = "mma",
    ):
        if kv_cache_dtype not in KV_DTYPES:
            raise InvalidParameter(
                f"kv_cache_dtype must be one of {sorted(KV_DTYPES)}, got {kv_cache_dtype!r}",
                param="kv_cache_dtype",
            )
        if matmul_input_dtype not in MATMUL_INPUT_DTYPES:
            raise InvalidParameter(
                f"matmul_input_dtype must be one of {list(MATMUL_INPUT_DTYPES)}, "
                f"got {matmul_input_dtype!r}",
                param="matmul_input_dtype",
            )
        if cuda_flash_prefill and kv_cache_dtype != "bfloat16":
            raise InvalidParameter(
                "cuda_flash_prefill needs kv_cache_dtype bfloat16 (its kernel reads bf16 keys "
                f"and values), got {kv_cache_dtype!r}",
                param="cuda_flash_prefill",
            )
        _check_prefill_gemm(cuda_prefill_gemm, matmul_input_dtype)
        c = self.config = loaded.config
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.max_blocks = -(-(max_model_len + 1) // block_size)
        self.stream = s = cuda.stream()
        split_rows = attention_split_rows(
            c, max_num_seqs, self.max_tokens, max_model_len + 1, split_attention_rows
        )
        self.model = CudaForward(
            c,
            loaded.weights,
            max_tokens=self.max_tokens,
            max_positions=max_model_len + 1,
            max_decode_rows=split_rows,
            stream=s,
            x_bf16=matmul_input_dtype == "bfloat16",
            flash_prefill=cuda_flash_prefill,
            wgmma=cuda_prefill_gemm == "wgmma",
        )
        # the mirror: [max_num_seqs, max_model_len + 1] int32 on the device
        self.token_ids_dev = cuda.to_device(np.zeros((max_num_seqs, max_model_len + 1), np.int32))
        self.num_tokens_dev = cuda.to_device(np.zeros(max_num_seqs, np.int32))
        # host-side slot state (the host knows prompts, not every sampled token)
        self.prompt_ids_host = np.zeros((max_num_seqs, max_model_len + 1), np.int32)
        self.prompt_lens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_logprobs = np.zeros(max_num_seqs, np.int32)
        self.block_tables = np.zeros((max_num_seqs, self.max_blocks), np.int32)
        self.num_slot_blocks = np.zeros(max_num_seqs, np.int32)
        self.sampling = SamplingTable.create(max_num_seqs)
        self.sampling_staged = StagedSamplingTable(self.sampling, RING, s)
        self.sampling_dev = self.sampling_staged.device
        self._sampling_dirty = False
        self.prompt_staging = PromptStaging(RING, self.max_tokens)
        # staging: step metadata in, sampled ids out, both pinned so copies are asynchronous
        n, S = self.max_tokens, max_num_seqs
        meta_size = 4 * n + 2 * S + 1 + S * self.max_blocks + 3 * S + 16
        self.meta_dev = cuda.device_array(meta_size, np.int32, stream=s)
        self.meta_host = [cuda.pinned_array(meta_size, np.int32) for _ in range(RING)]
        self.out_tokens_dev = cuda.device_array(S, np.int32, stream=s)
        self.sample_logits = cuda.device_array((S, c.vocab_size), np.float32, stream=s)
        self.tokens_host = [cuda.pinned_array(S, np.int32) for _ in range(RING)]
        self.sampler_scratch = ops.SamplerScratch.create(S, c.vocab_size, stream=s)
        self.logprobs_dev = ops.LogprobsOut.create(S, stream=s)
        self.logprobs_host = [
            ops.LogprobsOut(*(cuda.pinned_array(a.shape, a.dtype) for a in self.logprobs_dev))
            for _ in range(RING)
        ]
        self.events = [cuda.event() for _ in range(RING)]
        # each step's device work lies between its start event and its event: their elapsed
        # times add up to device_seconds (the metadata copy before the start event is not
        # counted); launch_seconds is the host's time in launch(), GIL waits included
        self.start_events = [cuda.event() for _ in range(RING)]
        self.device_seconds = self.launch_seconds = 0.0
        self._ring = 0
        self._views: dict = {}
        self.use_graphs = use_graphs
        # graphs' kernel edges programmatic (executor/cuda_graphs) where the kernels allow it
        self.programmatic_graphs = cuda_pdl and GRID_DEPENDENCY
        self.graphs: dict[int, CudaGraph] = {}
        self.buckets = graph_buckets(max_num_seqs, self.max_tokens)
        self.num_blocks = self._allocate_kv(kv_cache_memory, kv_cache_fraction, kv_cache_dtype)

    def _allocate_kv(self, budget_bytes: int, fraction: float, dtype_name: str) -> int:
        """KV blocks of dtype_name (KV_DTYPES) from a byte budget, or from a fraction of the
        device memory still free once weights and buffers are in place; both are logged."""
        c, s = self.config, self.stream
        dtype = np.dtype(KV_DTYPES[dtype_name])
        s.synchronize()
        free, total = free_device_memory()
        num_blocks = num_kv_blocks(
            c,
            block_size=self.block_size,
            budget_bytes=budget_bytes,
            fraction=fraction,
            free_bytes=free,
            itemsize=dtype.itemsize,
        )
        shape = (c.num_layers, num_blocks, self.block_size, c.num_kv_heads, c.head_dim)
        self.kv_k = cuda.device_array(shape, dtype, stream=s)
        self.kv_v = cuda.device_array(shape, dtype, stream=s)
        self.model.bind_kv(self.kv_k, self.kv_v)
        log.info(
            "GPU memory: %.1f of %.1f GiB free after weights; KV cache %d blocks x %d tokens "
            "= %.2f GiB %s (%s)",
            free / 2**30,
            total / 2**30,
            num_blocks,
            self.block_size,
            2 * self.kv_k.nbytes / 2**30,
            dtype_name,
            f"budget {budget_bytes} bytes" if budget_bytes else f"{fraction:.0%} of free",
        )
        return num_blocks

    # -- per-slot state -------------------------------------------------------------------
    def _apply(self, plan: StepPlan) -> None:
        s = self.stream
        for slot in plan.freed_slots:
            self.num_slot_blocks[slot] = 0
            self.sampling.clear_slot(slot)
            self._sampling_dirty = True
        prompts = []
        for seat in plan.seated:
            slot, n = seat.slot, len(seat.token_ids)
            ids = np.asarray(seat.token_ids, np.int32)
            self.prompt_ids_host[slot, :n] = ids
            prompts.append((slot, ids))
            self.prompt_lens[slot] = seat.prompt_len
            self.num_prompt_logprobs[slot] = seat.sampling.prompt_logprobs or 0
            self.block_tables[slot, : len(seat.block_ids)] = seat.block_ids
            self.num_slot_blocks[slot] = len(seat.block_ids)
            seat_sampling(self.sampling, seat, self.config.eos_token_ids)
            self._sampling_dirty = True
        extend_block_tables(plan.chunks, self.block_tables, self.num_slot_blocks)
        if prompts:  # pinned staging, one copy a prompt (executor/staging)
            self.prompt_staging.send(self._ring, prompts, self.token_ids_dev, s)
        if self._sampling_dirty:  # the whole table in one copy
            self.sampling_staged.send(self._ring, s)
            self._sampling_dirty = False

    # -- metadata staging ---------------------------------------------------------------------
    def _layout(self, T: int, S: int, R: int, B: int):
        """Offsets of each field in the metadata buffer for these counts, and device views of
        them (cached: graph buckets must see the same pointers every time)."""
        key = (T, S, R, B)
        found = self._views.get(key)
        if found is not None:
            return found
        shapes = {
            "token_slots": (T,),
            "positions": (T,),
            "slot_mapping": (T,),
            "query_start_loc": (S + 1,),
            "seq_lens": (S,),
            "block_tables": (S, self.max_blocks),
            "logits_rows": (R,),
            "sample_rows": (B,),
            "sample_slots": (B,),
            "sample_positions": (B,),
        }
        offsets, views, at = {}, {}, 0
        for name in _FIELDS:
            size = int(np.prod(shapes[name]))
            offsets[name] = (at, size)
            views[name] = self.meta_dev[at : at + size].reshape(shapes[name])
            at += size
        if len(self._views) > 256:  # eager shapes vary; keep the graph buckets' views
            self._views = {k: v for k, v in self._views.items() if k[0] in self.buckets}
        self._views[key] = found = (offsets, views, at)
        return found

    def _stage(self, fields: dict, counts: tuple) -> dict:
        offsets, views, total = self._layout(*counts)
        host = self.meta_host[self._ring]
        for name, (at, size) in offsets.items():
            host[at : at + size] = np.asarray(fields[name], np.int32).reshape(-1)
        self.meta_dev[:total].copy_to_device(host[:total], stream=self.stream)
        return views

    # -- one step -------------------------------------------------------------------------------
    def launch(self, plan: StepPlan) -> PendingStep:
        started = time.perf_counter()
        try:
            return self._launch(plan)
        finally:
            self.launch_seconds += time.perf_counter() - started

    def _launch(self, plan: StepPlan) -> PendingStep:
        ring = self._ring
        self.events[ring].synchronize()  # the staging slot's last user is done (normally a no-op)
        self._apply(plan)
        chunks = [c for c in plan.chunks if c.sample]
        if not plan.chunks:
            return PendingStep(plan.step_id, [], ring, None, [], {})
        prompt_lps = {}
        flat = flatten_chunks(plan.chunks, self.block_tables, self.block_size)
        B = len(chunks)
        fields = self._fields(flat, chunks)
        num_logprobs = [int(self.sampling.num_logprobs[c.slot]) for c in chunks]
        bucket = self._bucket(flat, B)
        if bucket:
            counts = graph_counts(bucket, self.max_num_seqs)
            views = self._stage(pad_step(fields, *counts[:2]), counts)
            self.start_events[ring].record(self.stream)
            self._graph(bucket, views).replay()
        else:
            T, S, R = len(flat.positions), len(flat.slots), len(flat.logits_rows)
            views = self._stage(fields, (T, S, R, B))
            self.start_events[ring].record(self.stream)
            logits = self.model.forward(self._inputs(views), self.token_ids_dev)
            prompt_lps = self._prompt_logprobs(plan, logits) if R > B else {}
            if B:
                if R != B:
                    rows = self.sample_logits[:B]
                    gather_rows(logits, views["sample_rows"], rows, stream=self.stream)
                    logits = rows
                self._sample(logits, views, B)
        if B:
            self.out_tokens_dev[:B].copy_to_host(self.tokens_host[ring][:B], stream=self.stream)
        if any(k >= 0 for k in num_logprobs):
            for dev, host in zip(self.logprobs_dev, self.logprobs_host[ring], strict=True):
                dev[:B].copy_to_host(host[:B], stream=self.stream)
        self.events[ring].record(self.stream)
        self._ring = (ring + 1) % RING
        return PendingStep(plan.step_id, chunks, ring, self.events[ring], num_logprobs, prompt_lps)

    def finish(self, pending: PendingStep) -> StepResult:
        if pending.event is not None:
            pending.event.synchronize()
            elapsed_ms = self.start_events[pending.ring].elapsed_time(pending.event)
            self.device_seconds += elapsed_ms / 1e3
        tokens, lp = self.tokens_host[pending.ring], self.logprobs_host[pending.ring]
        sampled = []
        for i, c in enumerate(pending.chunks):
            k, info = pending.num_logprobs[i], None
            if k >= 0:
                top_ids, top_lps = lp.top_ids[i, :k].tolist(), lp.top_logprobs[i, :k].tolist()
                info = TokenLogprobs(
                    int(tokens[i]), float(lp.logprob[i]), int(lp.rank[i]), top_ids, top_lps
                )
            sampled.append(SampledToken(c.slot, int(tokens[i]), info))
        return StepResult(pending.step_id, sampled, pending.prompt_logprobs)

    def execute(self, plan: StepPlan) -> StepResult:
        return self.finish(self.launch(plan))

    def compute_logits(self, plan: StepPlan):
        """Applies the plan and runs the model eagerly, without sampling: (host float32 logits
        of its logits rows, the flattened chunks), as ModelRunner.compute_logits returns the
        logits first; for teacher-forced checks."""
        self._apply(plan)
        flat = flatten_chunks(plan.chunks, self.block_tables, self.block_size)
        fields = self._fields(flat, [])
        fields["sample_rows"] = []
        counts = (len(flat.positions), len(flat.slots), len(flat.logits_rows), 0)
        logits = self.model.forward(self._inputs(self._stage(fields, counts)), self.token_ids_dev)
        host = logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return host, flat

    # -- helpers ----------------------------------------------------------------------------
    def _fields(self, flat, chunks: list) -> dict:
        """The metadata arrays of a step, by field name (see _FIELDS)."""
        return {
            "token_slots": flat.token_slots,
            "positions": flat.positions,
            "slot_mapping": flat.slot_mapping,
            "query_start_loc": flat.query_start_loc,
            "seq_lens": flat.seq_lens,
            "block_tables": self.block_tables[flat.slots],
            "logits_rows": flat.logits_rows,
            "sample_rows": flat.sample_rows,
            "sample_slots": [c.slot for c in chunks],
            "sample_positions": [c.start + c.num_tokens for c in chunks],
        }

    def _inputs(self, views: dict) -> StepInputs:
        return StepInputs(**{name: views[name] for name in StepInputs.__slots__})

    def _sample(self, logits, views: dict, B: int) -> None:
        # Logprobs are always requested: rows whose slot wants none are skipped by the kernel,
        # so one captured graph serves batches with and without them.
        out, lp = self.out_tokens_dev[:B], ops.LogprobsOut(*(a[:B] for a in self.logprobs_dev))
        ops.sample(
            logits,
            views["sample_slots"],
            views["sample_positions"],
            self.sampling_dev,
            self.token_ids_dev,
            self.num_tokens_dev,
            out,
            out_logprobs=lp,
            scratch=self.sampler_scratch,
            stream=self.stream,
        )

    def _bucket(self, flat, num_sampled: int) -> int:
        """The graph bucket this step replays in, or 0 to run it eagerly (prompt logprobs,
        which want more logits rows than samples, or more tokens than the largest bucket)."""
        if not self.use_graphs or len(flat.logits_rows) != num_sampled:
            return 0
        n = len(flat.positions)
        return next((b for b in self.buckets if b >= n), 0)

    def _graph_step(self, views: dict, rows: int) -> None:
        logits = self.model.forward(self._inputs(views), self.token_ids_dev)
        self._sample(logits, views, rows)

    def _graph(self, bucket: int, views: dict) -> CudaGraph:
        graph = self.graphs.get(bucket)
        if graph is None:
            # Eager once first: compiles every kernel and makes launcher placeholders, so the
            # capture records launches only. The metadata just staged pads the real step with
            # slot -1 rows, so this run computes the real step (KV writes, samples) and the
            # replay that follows computes it again, to the same values.
            rows = graph_counts(bucket, self.max_num_seqs)[3]
            self._graph_step(views, rows)
            self.stream.synchronize()
            graph = CudaGraph(
                self.stream,
                lambda: self._graph_step(views, rows),
                programmatic=self.programmatic_graphs,
            )
            self.graphs[bucket] = graph
        return graph

    def _prompt_logprobs(self, plan: StepPlan, logits) -> dict:
        """Prompt logprobs on the host (rare; the step waits for its logits)."""
        host = logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return prompt_logprobs(
            plan, host, self.prompt_ids_host, self.prompt_lens, self.num_prompt_logprobs, cpu_ops
        )

    def capture_all(self, progress=None) -> None:
        """Warm-up and capture of every bucket at start (steps of padding only)."""
        for bucket in self.buckets:
            fields = {name: np.zeros(0, np.int32) for name in _FIELDS}
            fields["query_start_loc"] = np.zeros(1, np.int32)
            fields["block_tables"] = np.zeros((0, self.max_blocks), np.int32)
            counts = graph_counts(bucket, self.max_num_seqs)
            self._graph(bucket, self._stage(pad_step(fields, *counts[:2]), counts))
            if progress is not None:
                progress(bucket)
        self.stream.synchronize()

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
