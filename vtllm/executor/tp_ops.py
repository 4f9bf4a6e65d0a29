"""The CPU ops of one tensor-parallel rank: CpuOps over the rank's shard (models/sharding),
with the collectives where a sharded forward needs them, so models/llama.py stays one forward:

- embed: each rank looks up the ids inside its vocab shard (others give zero rows), then an
  all-reduce (one non-zero term per element: exact);
- add_linear (o, down: row-parallel): the rank's partial product, then an all-reduce;
- lm_head: the rank's vocab columns of the logits, then an all-gather into [R, vocab] (the
  sampler needs whole rows: sampling and logprobs, not only greedy's argmax).

Every rank ends each op with the same bits, so the ranks run one residual stream and sample
the same tokens from the same logits (the token mirror lives on every rank). The GPU ops
would make the same three calls on their stream (docs/tensor_parallel.md).
"""

import dataclasses

import numpy as np

from vtllm.executor.communicator import Communicator
from vtllm.executor.cpu_ops import CpuOps
from vtllm.models.ops import Hidden, StepInputs
from vtllm.models.sharding import Shard
from vtllm.models.weights import ModelWeights, Weight


class ShardedCpuOps(CpuOps):
    def __init__(self, kernels, shard: Shard, comm: Communicator, full_vocab: int):
        super().__init__(kernels, shard.config)
        self.comm = comm
        self.vocab_start = shard.plan.vocab_start
        self.vocab_rows = shard.plan.vocab_rows
        self.full_vocab = full_vocab

    def fused_layers(self, weights: ModelWeights) -> None:
        """None: the fused layer adds o's and down's products with no all-reduce between."""
        return None

    def embed(self, weight: Weight, step: StepInputs) -> Hidden:
        local = step.input_ids - np.int32(self.vocab_start)
        outside = (local < 0) | (local >= self.vocab_rows)
        local[outside] = 0
        h = super().embed(weight, dataclasses.replace(step, input_ids=local))
        h.residual[outside] = 0.0
        self.comm.all_reduce(h.residual)
        return h

    def add_linear(self, x, weight: Weight, h: Hidden) -> None:
        super().add_linear(x, weight, h)
        self.comm.all_reduce(h.pending)

    def lm_head(self, h: Hidden, norm, weight: Weight, step: StepInputs) -> np.ndarray:
        local = super().lm_head(h, norm, weight, step)  # [R, vocab_padded]
        world, rows, width = self.comm.world_size, local.shape[0], local.shape[1]
        gathered = np.empty((world, rows, width), np.float32)
        self.comm.all_gather(local, gathered)
        logits = gathered.transpose(1, 0, 2).reshape(rows, world * width)
        return np.ascontiguousarray(logits[:, : self.full_vocab])
