"""Executes one StepPlan on the model: per-slot state, the token mirror, forward, sampling.

The runner's arrays are the "device" side of the token mirror: `token_ids[slot, pos]` holds
prompts and sampled tokens, and each step gathers its input ids from it, so a plan can name
a token the host has not seen yet (depth 2). Hot path: keep it lean, put features in helpers.
"""

import numpy as np

from vtllm.executor.step_layout import (
    extend_block_tables,
    flatten_chunks,
    prompt_logprobs,
    seat_sampling,
)
from vtllm.models.llama import ForwardBatch, KVCache, LlamaModel
from vtllm.models.loader import LoadedModel
from vtllm.scheduler.plan import SampledToken, StepPlan, StepResult, TokenLogprobs


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        ops,
        kv: KVCache,
        *,
        max_num_seqs: int,
        max_model_len: int,
    ):
        self.ops = ops
        self.config = loaded.config
        self.model = LlamaModel(loaded.config, loaded.weights, ops, max_model_len + 1)
        self.kv = kv
        self.block_size = kv.block_size
        self.max_model_len = max_model_len
        max_blocks = -(-(max_model_len + 1) // self.block_size)
        self.token_ids = np.zeros((max_num_seqs, max_model_len + 1), np.int32)  # the mirror
        self.num_tokens = np.zeros(max_num_seqs, np.int32)
        self.prompt_lens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_logprobs = np.zeros(max_num_seqs, np.int32)
        self.block_tables = np.zeros((max_num_seqs, max_blocks), np.int32)
        self.num_slot_blocks = np.zeros(max_num_seqs, np.int32)
        self.sampling = ops.SamplingTable.create(max_num_seqs)

    # -- per-slot state -------------------------------------------------------------------
    def _apply(self, plan: StepPlan) -> None:
        for slot in plan.freed_slots:
            self.num_tokens[slot] = 0
            self.num_slot_blocks[slot] = 0
            self.sampling.clear_slot(slot)
        eos = self.config.eos_token_ids
        for seat in plan.seated:
            slot, n = seat.slot, len(seat.token_ids)
            self.token_ids[slot, :n] = seat.token_ids
            self.num_tokens[slot] = n
            self.prompt_lens[slot] = seat.prompt_len
            self.num_prompt_logprobs[slot] = seat.sampling.prompt_logprobs or 0
            self.block_tables[slot, : len(seat.block_ids)] = seat.block_ids
            self.num_slot_blocks[slot] = len(seat.block_ids)
            seat_sampling(self.sampling, seat, eos)
        extend_block_tables(plan.chunks, self.block_tables, self.num_slot_blocks)

    def _batch(self, plan: StepPlan) -> tuple[ForwardBatch, list[int], list[int]]:
        flat = flatten_chunks(plan.chunks, self.block_tables, self.block_size)
        batch = ForwardBatch(
            input_ids=np.ascontiguousarray(self.token_ids[flat.token_slots, flat.positions]),
            positions=flat.positions,
            slot_mapping=flat.slot_mapping,
            query_start_loc=flat.query_start_loc,
            seq_lens=flat.seq_lens,
            block_tables=np.ascontiguousarray(self.block_tables[flat.slots]),
            logits_rows=flat.logits_rows,
        )
        return batch, flat.sample_rows, flat.logits_rows.tolist()

    # -- one step ----------------------------------------------------------------------------
    def compute_logits(self, plan: StepPlan):
        """Applies the plan and runs the model: logits of the sampled rows, or of every row of
        chunks that asked for prompt logprobs. Returns (logits, batch, sample_rows, logits_rows)."""
        self._apply(plan)
        batch, sample_rows, logits_rows = self._batch(plan)
        return self.model.forward(batch, self.kv), batch, sample_rows, logits_rows

    def execute(self, plan: StepPlan) -> StepResult:
        if not plan.chunks:
            self._apply(plan)
            return StepResult(plan.step_id, [])
        logits, batch, sample_rows, logits_rows = self.compute_logits(plan)
        sampled = self._sample(plan, logits, sample_rows)
        prompt_lps = self._prompt_logprobs(plan, logits, batch, logits_rows)
        return StepResult(plan.step_id, sampled, prompt_lps)

    def _sample(self, plan: StepPlan, logits: np.ndarray, sample_rows: list[int]):
        chunks = [c for c in plan.chunks if c.sample]
        if not chunks:
            return []
        n = len(chunks)
        slots = np.fromiter((c.slot for c in chunks), np.int32, n)
        positions = np.fromiter((c.start + c.num_tokens for c in chunks), np.int32, n)
        rows = (
            np.ascontiguousarray(logits[sample_rows]) if len(sample_rows) != len(logits) else logits
        )
        tokens = np.empty(n, np.int32)
        want = self.sampling.num_logprobs[slots] >= 0
        lp = self.ops.LogprobsOut.create(n) if want.any() else None
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
        out = []
        for i, c in enumerate(chunks):
            info = None
            if want[i]:
                k = int(self.sampling.num_logprobs[c.slot])
                info = TokenLogprobs(
                    int(tokens[i]),
                    float(lp.logprob[i]),
                    int(lp.rank[i]),
                    lp.top_ids[i, :k].tolist(),
                    lp.top_logprobs[i, :k].tolist(),
                )
            out.append(SampledToken(c.slot, int(tokens[i]), info))
        return out

    def _prompt_logprobs(self, plan, logits, batch, logits_rows) -> dict:
        return prompt_logprobs(
            plan, logits, self.token_ids, self.prompt_lens, self.num_prompt_logprobs, self.ops
        )
