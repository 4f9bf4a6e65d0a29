"""The CUDA ops of one tensor-parallel rank: CudaOps over the rank's shard (models/sharding),
with the collectives where a sharded forward needs them, as executor/tp_ops does on the CPU.
Hot path: keep it lean.

- embed: the ids inside the rank's vocab shard look up their rows, every other id a zero row
  (kernels/cuda/tensor_parallel.embedding_shard), then an all-reduce (one non-zero term per
  element: exact);
- add_linear (o, down: row-parallel): the rank's partial product into the pending buffer, then
  an all-reduce of it; the next rms_norm adds it to the residual stream;
- lm_head: the rank's vocab columns of the logits, an all-gather [world, R, width], then
  whole rows [R, vocab] (unshard_columns) for the sampler, which every rank runs alike.

Every collective is enqueued on the step's stream through a DeviceCommunicator
(executor/device_communicator): NCCL's never waits on the host, so a step's graph captures
them with its kernels. The one-token fold of CudaOps is off here: its linears add o's and
down's products straight into the residual stream and its norms read that stream, with no
point between the product and the add where the partial products could be summed.
"""

import numpy as np
from numba import cuda

from vtllm.executor.cuda_ops import CudaOps
from vtllm.kernels.cuda.tensor_parallel import embedding_shard, unshard_columns
from vtllm.models.config import ModelConfig
from vtllm.models.ops import Hidden, StepInputs
from vtllm.models.sharding import Shard
from vtllm.models.weights import ModelWeights


class ShardedCudaOps(CudaOps):
    def __init__(self, config: ModelConfig, *, shard: Shard, comm, vocab: int, **kw):
        """config: the shard's (shard.config: its heads, intermediate columns and the padded
        width of one vocab shard); comm: a DeviceCommunicator; vocab: the model's vocabulary;
        kw: CudaOps' buffers and settings."""
        super().__init__(config, **kw)
        self.comm, self.full_vocab = comm, vocab
        self.vocab_start = shard.plan.vocab_start
        world, n, width = comm.world_size, kw["max_tokens"], config.vocab_size
        self.parts = cuda.device_array(world * n * width, np.float32, stream=self.stream)
        self.unsharded = None  # world 1: the gathered rows are whole already
        if world > 1:
            self.unsharded = cuda.device_array(n * vocab, np.float32, stream=self.stream)

    def bind(self, weights: ModelWeights, cos_sin):
        model = super().bind(weights, cos_sin)
        self.foldable = False  # the module docstring
        return model

    def embed(self, weight, step: StepInputs) -> Hidden:
        ids, residual = self._start(step)
        embedding_shard(
            ids, weight.data, weight.qtype, self.vocab_start, residual, stream=self.stream
        )
        self.comm.all_reduce(residual, stream=self.stream)
        return Hidden(residual)

    def embed_scaled(self, weight, step: StepInputs, factor: float) -> Hidden:
        raise NotImplementedError("Gemma is not split over ranks (models/sharding)")

    def add_linear(self, x, weight, h: Hidden) -> None:
        super().add_linear(x, weight, h)  # never folded here: the product is pending
        self.comm.all_reduce(h.pending, stream=self.stream)

    def lm_head(self, h: Hidden, norm, weight, step: StepInputs):
        local = super().lm_head(h, norm, weight, step)  # [R, width]
        rows, width = local.shape
        world = self.comm.world_size
        if rows == 0:  # no row of this step wants logits
            return local
        parts = self.parts[: world * rows * width].reshape(world, rows, width)
        self.comm.all_gather(local, parts, stream=self.stream)
        if self.unsharded is None:
            return parts.reshape(rows, width)
        logits = self.unsharded[: rows * self.full_vocab].reshape(rows, self.full_vocab)
        unshard_columns(parts, logits, stream=self.stream)
        return logits
