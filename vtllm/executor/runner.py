"""Executes StepPlans: one runner for every device. Hot path: keep it lean.

StepRunner holds what every device does alike: the per-slot state a plan changes (prompts,
block tables, sampling settings), the flattening of a plan's chunks into the forward's
metadata, and the results: sampled tokens with their logprobs, and prompt logprobs from host
logits. A device subclass supplies the rest through a few hooks (`_seat`, `_free`,
`_sampling_changed`, `_launch`, `_collect`, `_logits`): where the token mirror lives, how a
step's metadata reaches the forward, how the forward and the sampler run, and when their
output can be read. The contracts are one for every device:

  launch(plan) -> PendingStep    applies the plan and starts the step (on the CPU it runs it)
  finish(pending) -> StepResult  waits for the step and reads its tokens (depth 2: one step
                                 late, while the next already runs)
  compute_logits(plan) -> (host float32 logits of the step's logits rows, FlatChunks),
                                 without sampling, for teacher-forced checks

The mirror (`token_ids[slot, pos]`) holds prompts and sampled tokens, and each step gathers
its input ids from it, so a plan can name a token the host has not seen yet (depth 2).
ModelRunner is the CPU device: the mirror is a host array and a step runs when launched.
"""

from dataclasses import dataclass

import numpy as np

from vtllm.executor.cpu_ops import CpuOps
from vtllm.executor.speculative import (
    first_sample_positions,
    token_logprobs,
    verify_drafts,
    write_drafts,
)
from vtllm.executor.step_layout import (
    FlatChunks,
    apply_token_masks,
    extend_block_tables,
    flatten_chunks,
    prompt_logprobs,
    seat_sampling,
    token_masks,
)
from vtllm.kernels.sampling_table import SamplingTable
from vtllm.models.loader import LoadedModel
from vtllm.models.ops import KVCache, StepInputs
from vtllm.models.registry import model_class
from vtllm.scheduler.plan import Chunk, SampledToken, StepPlan, StepResult


@dataclass(slots=True)
class StepOutput:
    """What a device hands back for a step: host arrays."""

    tokens: np.ndarray  # [B] int32: the sampled ids, in sampling-chunk order
    logprobs: object | None  # LogprobsOut of those rows, or None when no row wants them
    logits: np.ndarray | None  # [R, vocab] float32 when a chunk wants prompt logprobs
    more: list | None = None  # speculative chunks' later tokens (executor/speculative.py)


@dataclass(slots=True)
class PendingStep:
    plan: StepPlan
    chunks: list[Chunk]  # the sampling chunks, in order
    num_logprobs: list[int]  # per sampling chunk: top logprobs wanted (-1: none), at launch
    handle: object  # the device's step in flight; None for a plan without chunks


class StepRunner:
    def __init__(self, config, *, block_size: int, max_num_seqs: int, max_model_len: int):
        self.config = config
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_blocks = -(-(max_model_len + 1) // block_size)
        # host-side slot state (the host knows prompts, not every sampled token)
        self.prompt_ids = np.zeros((max_num_seqs, max_model_len + 1), np.int32)
        self.prompt_lens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_logprobs = np.zeros(max_num_seqs, np.int32)
        self.block_tables = np.zeros((max_num_seqs, self.max_blocks), np.int32)
        self.num_slot_blocks = np.zeros(max_num_seqs, np.int32)
        self.sampling = SamplingTable.create(max_num_seqs)

    # -- device hooks -----------------------------------------------------------------------
    def _free(self, slots: list[int]) -> None:
        """Slots whose requests left: their mirror rows are free."""

    def _seat(self, prompts: list[tuple[int, np.ndarray]]) -> None:
        """(slot, known ids) of seated requests, into the mirror."""

    def _sampling_changed(self) -> None:
        """self.sampling changed; the sampler must see it from this step on."""

    def _launch(
        self, flat: FlatChunks, chunks: list[Chunk], num_logprobs, want_logits: bool, masks
    ):
        """Starts the forward and the sampler over a step; returns the device's handle.
        masks: (sampling row, int32 packed token mask) of constrained rows: logits of tokens
        whose bit is clear become -inf before sampling (and before their logprobs); or a call
        that returns them, to make once the forward is done (StepRunner.launch's wait_masks)."""
        raise NotImplementedError

    def _collect(self, handle) -> StepOutput:
        raise NotImplementedError

    def _logits(self, flat: FlatChunks) -> np.ndarray:
        """The forward alone, eagerly: host logits of flat's logits rows."""
        raise NotImplementedError

    # -- per-slot state ---------------------------------------------------------------------
    def apply(self, plan: StepPlan) -> None:
        # blocks freed outside a sliding window become the null block (attention never reads
        # them), so nothing through these entries can reach a block another request now holds
        for slot, n in plan.released_blocks.items():
            self.block_tables[slot, :n] = 0
        for slot in plan.freed_slots:
            self.num_slot_blocks[slot] = 0
            self.sampling.clear_slot(slot)
        if plan.freed_slots:
            self._free(plan.freed_slots)
        prompts = []
        for seat in plan.seated:
            slot, n = seat.slot, len(seat.token_ids)
            ids = np.asarray(seat.token_ids, np.int32)
            self.prompt_ids[slot, :n] = ids
            prompts.append((slot, ids))
            self.prompt_lens[slot] = seat.prompt_len
            self.num_prompt_logprobs[slot] = seat.sampling.prompt_logprobs or 0
            self.block_tables[slot, : len(seat.block_ids)] = seat.block_ids
            self.num_slot_blocks[slot] = len(seat.block_ids)
            seat_sampling(self.sampling, seat, self.config.eos_token_ids)
        extend_block_tables(plan.chunks, self.block_tables, self.num_slot_blocks)
        if prompts:
            self._seat(prompts)
        if plan.freed_slots or plan.seated:
            self._sampling_changed()

    # -- one step ---------------------------------------------------------------------------
    def launch(self, plan: StepPlan, wait_masks=None) -> PendingStep:
        """wait_masks: None, or a call that returns once plan.token_masks is filled; a device
        that samples where it runs the forward (the CPU) makes it after the forward, so the
        host computes the masks while the forward runs."""
        self.apply(plan)
        if not plan.chunks:
            return PendingStep(plan, [], [], None)
        flat = flatten_chunks(plan.chunks, self.block_tables, self.block_size)
        chunks = [c for c in plan.chunks if c.sample]
        num_logprobs = [int(self.sampling.num_logprobs[c.slot]) for c in chunks]
        want_logits = any(c.prompt_logprobs for c in plan.chunks)
        if wait_masks is None:
            masks = token_masks(plan.token_masks, chunks) if plan.token_masks else []
        else:

            def masks():
                wait_masks()
                return token_masks(plan.token_masks, chunks) if plan.token_masks else []

        handle = self._launch(flat, chunks, num_logprobs, want_logits, masks)
        return PendingStep(plan, chunks, num_logprobs, handle)

    def finish(self, pending: PendingStep) -> StepResult:
        plan = pending.plan
        if pending.handle is None:
            return StepResult(plan.step_id, [])
        out = self._collect(pending.handle)
        tokens, lp, more = out.tokens, out.logprobs, out.more
        sampled = []
        for i, c in enumerate(pending.chunks):
            k, info = pending.num_logprobs[i], None
            if k >= 0:
                info = token_logprobs(int(tokens[i]), lp, i, k)
            if more is not None and more[i] is not None:
                sampled.append(SampledToken(c.slot, int(tokens[i]), info, *more[i]))
            else:
                sampled.append(SampledToken(c.slot, int(tokens[i]), info))
        prompt_lps = {}
        if out.logits is not None:
            # imported here, not with the module: kernels.cpu compiles its kernels on import,
            # which a start must do inside its compile phase (vtllm/cli/warmup.py logs it)
            from vtllm.kernels import cpu as cpu_kernels

            prompt_lps = prompt_logprobs(
                plan,
                out.logits,
                self.prompt_ids,
                self.prompt_lens,
                self.num_prompt_logprobs,
                cpu_kernels,
            )
        return StepResult(plan.step_id, sampled, prompt_lps)

    def execute(self, plan: StepPlan, wait_masks=None) -> StepResult:
        return self.finish(self.launch(plan, wait_masks))

    def compute_logits(self, plan: StepPlan) -> tuple[np.ndarray, FlatChunks]:
        """Applies the plan and runs the model without sampling: (host float32 logits of its
        logits rows, the flattened chunks); for teacher-forced checks."""
        self.apply(plan)
        flat = flatten_chunks(plan.chunks, self.block_tables, self.block_size)
        return self._logits(flat), flat


class ModelRunner(StepRunner):
    """The CPU device: host arrays, a step computed when launched (on the backend's worker
    thread, executor/backend). `ops` is a CPU kernel table (kernels.cpu or its fast table)."""

    def __init__(
        self, loaded: LoadedModel, ops, kv: KVCache, *, max_num_seqs: int, max_model_len: int
    ):
        super().__init__(
            loaded.config,
            block_size=kv.block_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        )
        self.ops, self.kv = ops, kv
        model_ops = CpuOps(ops, loaded.config)
        forward = model_class(loaded.config.architecture)
        self.model = forward(loaded.config, loaded.weights, model_ops, max_model_len + 1)
        model_ops.bind_kv(kv)
        self.token_ids = np.zeros((max_num_seqs, max_model_len + 1), np.int32)  # the mirror
        self.num_tokens = np.zeros(max_num_seqs, np.int32)

    def _free(self, slots) -> None:
        self.num_tokens[slots] = 0

    def _seat(self, prompts) -> None:
        for slot, ids in prompts:
            self.token_ids[slot, : len(ids)] = ids
            self.num_tokens[slot] = len(ids)

    def _inputs(self, flat: FlatChunks) -> StepInputs:
        return StepInputs(
            token_slots=flat.token_slots,
            input_ids=np.ascontiguousarray(self.token_ids[flat.token_slots, flat.positions]),
            positions=flat.positions,
            slot_mapping=flat.slot_mapping,
            query_start_loc=flat.query_start_loc,
            seq_lens=flat.seq_lens,
            block_tables=np.ascontiguousarray(self.block_tables[flat.slots]),
            logits_rows=flat.logits_rows,
        )

    def _logits(self, flat: FlatChunks) -> np.ndarray:
        return self.model.forward(self._inputs(flat))

    def _launch(self, flat, chunks, num_logprobs, want_logits, masks) -> StepOutput:
        speculative = any(c.draft_token_ids for c in chunks)
        if speculative:
            write_drafts(self.token_ids, chunks)
        logits = self._logits(flat)
        if callable(masks):
            masks = masks()
        n, lp, more = len(chunks), None, None
        tokens = np.empty(n, np.int32)
        if n:
            slots = np.fromiter((c.slot for c in chunks), np.int32, n)
            positions = first_sample_positions(chunks)
            rows = flat.sample_rows
            rows = np.ascontiguousarray(logits[rows]) if len(rows) != len(logits) else logits
            if masks:
                rows = rows.copy() if rows is logits else rows  # prompt logprobs read logits
                apply_token_masks(rows, masks)
            lp = self.ops.LogprobsOut.create(n) if max(num_logprobs) >= 0 else None
            self.ops.sample(
                rows,
                slots,
                positions,
                self.sampling,
                self.token_ids,
                self.num_tokens,
                tokens,
                out_logprobs=lp,
            )
            if speculative:
                more = verify_drafts(
                    self.ops,
                    logits,
                    flat.sample_rows,
                    chunks,
                    tokens,
                    positions,
                    num_logprobs,
                    self,
                )
        return StepOutput(tokens, lp, logits if want_logits else None, more)

    def _collect(self, handle: StepOutput) -> StepOutput:
        return handle
