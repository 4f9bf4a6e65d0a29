"""The CUDA device under the one runner (executor/runner): the device token mirror, staged
metadata, graphs, sampling on the stream. Hot path: keep it lean, put features in helpers.

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

from vtllm.executor.cuda_graph_steps import (
    GraphedSteps,
    graph_rounds,
    graph_shape,
    pad_graph_step,
    spec_graph_buckets,
)
from vtllm.executor.cuda_graphs import CudaGraph, free_device_memory
from vtllm.executor.cuda_knobs import SPLIT_SCRATCH_BYTES, attention_split_rows, check_knobs
from vtllm.executor.cuda_ops import CudaOps
from vtllm.executor.cuda_speculative import SpeculativeRounds, first_positions
from vtllm.executor.cuda_tp_ops import ShardedCudaOps
from vtllm.executor.kv_cache import num_kv_blocks
from vtllm.executor.runner import StepOutput, StepRunner
from vtllm.executor.speculative import token_drafts
from vtllm.executor.staging import PromptStaging, StagedSamplingTable
from vtllm.executor.step_layout import graph_buckets
from vtllm.kernels import cuda as ops
from vtllm.kernels.cuda import GRID_DEPENDENCY, KV_DTYPES
from vtllm.kernels.cuda.gather import gather_rows
from vtllm.models.loader import LoadedModel
from vtllm.models.ops import KVCache, StepInputs
from vtllm.models.registry import check_cuda, model_class
from vtllm.scheduler.plan import StepPlan

__all__ = ["SPLIT_SCRATCH_BYTES", "CudaModelRunner", "attention_split_rows"]

log = logging.getLogger("vtllm.cuda")

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
    "sample_masks",  # per sampled row: its row of mask_bits_dev, or -1 (unconstrained)
    "token_drafts",  # per token row: the draft it carries, or -1 (executor/cuda_speculative)
)
_STEP_FIELDS = _FIELDS[:7]  # what the forward reads (models/ops.StepInputs)


@dataclass(slots=True)
class InFlight:
    ring: int  # staging slot holding the sampled ids
    event: object
    logits: np.ndarray | None  # host logits, when the step wanted prompt logprobs
    spec: tuple | None = None  # speculative steps: (sampling chunks, logprobs wanted, seats)


class CudaModelRunner(GraphedSteps, StepRunner):
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
        cuda_kquant_tensor_cores: bool = False,
        speculative_tokens: int = 0,
        speculative_max_batch: int = 0,
        shard=None,  # a tensor-parallel rank's shard (models/sharding) and DeviceCommunicator:
        comm=None,  # the forward runs it over executor/cuda_tp_ops, slots and sampler the model's
    ):
        check_cuda(loaded.config.architecture)  # families whose ops are CPU-only so far
        check_knobs(kv_cache_dtype, matmul_input_dtype, cuda_flash_prefill, cuda_prefill_gemm)
        super().__init__(
            loaded.config,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        )
        c = self.config
        mc, weights = (c, loaded.weights) if shard is None else (shard.config, shard.weights)
        self.max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.stream = s = cuda.stream()
        split_rows = attention_split_rows(
            mc, max_num_seqs, self.max_tokens, max_model_len + 1, split_attention_rows
        )
        # the mirror: [max_num_seqs, max_model_len + 1] int32 on the device
        self.token_ids_dev = cuda.to_device(np.zeros((max_num_seqs, max_model_len + 1), np.int32))
        self.num_tokens_dev = cuda.to_device(np.zeros(max_num_seqs, np.int32))
        sharded = {} if shard is None else {"shard": shard, "comm": comm, "vocab": c.vocab_size}
        self.ops = (CudaOps if shard is None else ShardedCudaOps)(
            mc,
            max_tokens=self.max_tokens,
            max_positions=max_model_len + 1,
            max_decode_rows=split_rows,
            mirror=self.token_ids_dev,
            stream=s,
            x_bf16=matmul_input_dtype == "bfloat16",
            flash_prefill=cuda_flash_prefill,
            wgmma=cuda_prefill_gemm == "wgmma",
            kquant=cuda_kquant_tensor_cores,
            **sharded,
        )
        forward = model_class(c.architecture)
        self.model = forward(mc, weights, self.ops, max_model_len + 1)
        self.sampling_staged = StagedSamplingTable(self.sampling, RING, s)
        self.sampling_dev = self.sampling_staged.device
        self.prompt_staging = PromptStaging(RING, self.max_tokens)
        # staging: step metadata in, sampled ids out, both pinned so copies are asynchronous
        n, S = self.max_tokens, max_num_seqs
        meta_size = 5 * n + 2 * S + 1 + S * self.max_blocks + 4 * S + 16
        self.meta_dev = cuda.device_array(meta_size, np.int32, stream=s)
        self.meta_host = [cuda.pinned_array(meta_size, np.int32) for _ in range(RING)]
        self.out_tokens_dev = cuda.device_array(S, np.int32, stream=s)
        self.sample_logits = cuda.device_array((S, c.vocab_size), np.float32, stream=s)
        # constrained rows' packed token masks, row b for sampled row b (executor/runner)
        words = (c.vocab_size + 31) // 32
        self.mask_bits_dev = cuda.device_array((S, words), np.int32, stream=s)
        self.mask_bits_host = [cuda.pinned_array((S, words), np.int32) for _ in range(RING)]
        self.tokens_host = [cuda.pinned_array(S, np.int32) for _ in range(RING)]
        self.sampler_scratch = ops.SamplerScratch.create(S, c.vocab_size, stream=s)
        self.logprobs_dev = ops.LogprobsOut.create(S, stream=s)
        self.logprobs_host = [
            ops.LogprobsOut(*(cuda.pinned_array(a.shape, a.dtype) for a in self.logprobs_dev))
            for _ in range(RING)
        ]
        self.events = [cuda.event() for _ in range(RING)]
        self.spec_rounds = SpeculativeRounds(S, RING, s, speculative_tokens)
        self.slot_seats = np.zeros(S, np.int64)  # requests seated in each slot so far
        # each step's device work lies between its start event and its event: their elapsed
        # times add up to device_seconds (the metadata copy before the start event is not
        # counted); launch_seconds is the host's time in launch(), GIL waits included
        self.start_events = [cuda.event() for _ in range(RING)]
        self.device_seconds = self.launch_seconds = 0.0
        self._ring = 0
        self._views: dict = {}
        self.use_graphs = use_graphs
        # graphs' kernel edges programmatic (executor/cuda_graphs) where the kernels allow it
        # (not beside a rank's NCCL kernels, which do not wait for the kernel before them)
        self.programmatic_graphs = cuda_pdl and GRID_DEPENDENCY and shard is None
        # plain steps by token bucket; steps with drafts by (sequence bucket, rounds)
        self.graphs: dict[int | tuple[int, int], CudaGraph] = {}
        self.buckets = graph_buckets(max_num_seqs, self.max_tokens)
        # steps with drafts of up to speculative_max_batch sequences: graphs of k rounds
        self.spec_tokens = speculative_tokens
        self.spec_buckets = spec_graph_buckets(
            self.buckets, S, self.max_tokens, speculative_tokens, speculative_max_batch
        )
        self.num_blocks = self._allocate_kv(kv_cache_memory, kv_cache_fraction, kv_cache_dtype)

    def _allocate_kv(self, budget_bytes: int, fraction: float, dtype_name: str) -> int:
        """KV blocks of dtype_name (KV_DTYPES) from a byte budget, or from a fraction of the
        device memory still free once weights and buffers are in place; both are logged."""
        c, s = self.ops.config, self.stream  # a rank's cache: its shard's KV heads
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
        self.ops.bind_kv(KVCache(self.kv_k, self.kv_v))
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
            "sample_masks": (B,),
            "token_drafts": (T,),
        }
        offsets, views, at = {}, {}, 0
        for name in _FIELDS:
            size = int(np.prod(shapes[name]))
            offsets[name] = (at, size)
            views[name] = self.meta_dev[at : at + size].reshape(shapes[name])
            at += size
        if len(self._views) > 256:  # eager shapes vary; keep the graphs' views
            graphs = {graph_shape(k, self.max_num_seqs) for k in self.graphs}
            self._views = {k: v for k, v in self._views.items() if k in graphs}
        self._views[key] = found = (offsets, views, at)
        return found

    def _stage(self, fields: dict, counts: tuple) -> dict:
        offsets, views, total = self._layout(*counts)
        host = self.meta_host[self._ring]
        for name, (at, size) in offsets.items():
            host[at : at + size] = np.asarray(fields[name], np.int32).reshape(-1)
        self.meta_dev[:total].copy_to_device(host[:total], stream=self.stream)
        return views

    # -- the runner's device hooks (executor/runner) ----------------------------------------
    def _seat(self, prompts) -> None:  # pinned staging, one copy a prompt (executor/staging)
        self.slot_seats[[slot for slot, _ in prompts]] += 1
        self.prompt_staging.send(self._ring, prompts, self.token_ids_dev, self.stream)

    def _sampling_changed(self) -> None:  # the whole table in one copy
        self.sampling_staged.send(self._ring, self.stream)

    def launch(self, plan: StepPlan, wait_masks=None):
        started = time.perf_counter()
        try:
            self.events[self._ring].synchronize()  # the staging slot's last user is done
            return super().launch(plan, wait_masks)
        finally:
            self.launch_seconds += time.perf_counter() - started

    def _launch(self, flat, chunks, num_logprobs, want_logits: bool, masks) -> InFlight:
        ring, logits_host, spec = self._ring, None, None
        B = len(chunks)
        fields = self._fields(flat, chunks)
        rounds = max((len(c.draft_token_ids) for c in chunks), default=0)
        if masks:
            fields["sample_masks"] = self._send_masks(masks, B)
        key = self._graph_key(flat, B, want_logits, rounds)
        if key is not None:
            counts = graph_shape(key, self.max_num_seqs)
            views = self._stage(pad_graph_step(key, fields, counts), counts)
            self.start_events[ring].record(self.stream)
            self._graph(key, views).replay()
            rounds = graph_rounds(key)
        else:
            R = len(flat.logits_rows)
            views = self._stage(fields, (len(flat.positions), len(flat.slots), R, B))
            self.start_events[ring].record(self.stream)
            logits_host = self._step(views, B, rounds, R != B, want_logits)
        if rounds:
            spec = self.spec_rounds.copy_back(self, chunks, num_logprobs, ring, rounds)
        if B:
            self.out_tokens_dev[:B].copy_to_host(self.tokens_host[ring][:B], stream=self.stream)
        if any(k >= 0 for k in num_logprobs):
            for dev, host in zip(self.logprobs_dev, self.logprobs_host[ring], strict=True):
                dev[:B].copy_to_host(host[:B], stream=self.stream)
        self.events[ring].record(self.stream)
        self._ring = (ring + 1) % RING
        return InFlight(ring, self.events[ring], logits_host, spec)

    def _collect(self, step: InFlight) -> StepOutput:
        step.event.synchronize()
        elapsed_ms = self.start_events[step.ring].elapsed_time(step.event)
        self.device_seconds += elapsed_ms / 1e3
        ring, more = step.ring, None
        if step.spec is not None:
            more = self.spec_rounds.collect(self, ring, step.spec)
        return StepOutput(self.tokens_host[ring], self.logprobs_host[ring], step.logits, more)

    def _logits(self, flat) -> np.ndarray:
        fields = self._fields(flat, [])
        fields["sample_rows"] = []
        counts = (len(flat.positions), len(flat.slots), len(flat.logits_rows), 0)
        logits = self.model.forward(self._inputs(self._stage(fields, counts)))
        host = logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return host

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
            "sample_positions": first_positions(chunks),
            "sample_masks": np.full(len(chunks), -1, np.int32),
            "token_drafts": token_drafts(flat, chunks),
        }

    def _send_masks(self, masks, B: int) -> np.ndarray:
        """Copies the constrained rows' masks to the device; the sample_masks field."""
        host, rows = self.mask_bits_host[self._ring], np.full(B, -1, np.int32)
        for b, bits in masks:
            host[b] = bits
            rows[b] = b
        end = masks[-1][0] + 1
        self.mask_bits_dev[:end].copy_to_device(host[:end], stream=self.stream)
        return rows

    def _inputs(self, views: dict) -> StepInputs:
        return StepInputs(**{name: views[name] for name in _STEP_FIELDS})

    def _sample(self, logits, views: dict, B: int) -> None:
        # Logprobs are always requested: rows whose slot wants none are skipped by the kernel,
        # so one captured graph serves batches with and without them.
        out, lp = self.out_tokens_dev[:B], ops.LogprobsOut(*(a[:B] for a in self.logprobs_dev))
        ops.apply_token_masks(logits, self.mask_bits_dev, views["sample_masks"], stream=self.stream)
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

    def _step(self, views, samples: int, rounds: int, gather: bool, want_logits=False):
        """A step's launches (a graph's, or eager): drafts into the mirror, the forward, the
        first draws (from the sampled rows gathered, when not every logits row is one), the
        verification rounds (executor/cuda_speculative). Returns the host logits, when
        wanted (rare: the step then waits for them)."""
        if rounds:
            self.spec_rounds.write_drafts(self.token_ids_dev, views, self.stream)
        logits = all_rows = self.model.forward(self._inputs(views))
        host = None
        if want_logits:
            host = logits.copy_to_host(stream=self.stream)
            self.stream.synchronize()
        if samples:
            if gather:
                logits = self.sample_logits[:samples]
                gather_rows(all_rows, views["sample_rows"], logits, stream=self.stream)
            self._sample(logits, views, samples)
        if rounds:
            self.spec_rounds.enqueue(self, all_rows, views, samples, rounds)
        return host

    def capture_all(self, progress=None) -> None:
        """Warm-up and capture of every graph at start (steps of padding only)."""
        for key in self.graph_keys:
            fields = {name: np.zeros(0, np.int32) for name in _FIELDS}
            fields["query_start_loc"] = np.zeros(1, np.int32)
            fields["block_tables"] = np.zeros((0, self.max_blocks), np.int32)
            counts = graph_shape(key, self.max_num_seqs)
            self._graph(key, self._stage(pad_graph_step(key, fields, counts), counts))
            if progress is not None:
                progress(key)
        self.stream.synchronize()

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
