"""What the CUDA backend adds for the mixture-of-experts forward (models/ops.MoeOps): the router
and the routed experts, on the stream, over static buffers (CudaOps' arena: a step with experts
is captured into a graph like any other). Hot path: keep it lean.

Per routed layer: the router as a linear (float32 logits), the top-k on the device, the
(token, rank) pairs grouped by expert (in the tiles the layer's expert kernel reads), then each
pair through its expert's gate/up, silu * up and down (the tensor cores for bf16 experts), and
the combine (kernels/cuda/moe: one path for every step size, so a token's bits are its own).
On one-token steps whose norms fold into the linears (CudaOps.fold) the ffn norm arrives
deferred: route runs it as the plain norm kernel, and the combine adds into the residual
stream itself (the bits of the pending add the unfolded step does in the next norm).
"""

from dataclasses import dataclass

import numpy as np

from vtllm.kernels import cuda as kernels
from vtllm.kernels.cuda.moe import (
    DeviceExperts,
    PairGroups,
    combine,
    group_pairs,
    route_top_k,
    upload_experts,
)
from vtllm.models.config import ModelConfig
from vtllm.models.ops import Hidden
from vtllm.models.weights import MoeWeights


@dataclass(slots=True)
class DeviceMoe:
    """A routed layer's weights as CudaMoeOps takes them back from the model: gate_up holds
    the experts (gate/up and down, stacked), down the same object."""

    router: object  # DeviceWeight [num_experts, hidden]
    gate_up: DeviceExperts
    down: DeviceExperts


def upload_moe(moe: MoeWeights, upload_router, *, stream, x_bf16: bool) -> DeviceMoe:
    """moe's experts stacked on the device (bf16 ones packed for the tensor cores); upload_router
    uploads the router as a dense matrix (CudaOps' own weight upload). x_bf16: the rounding of x
    the packed experts take, the dense linears' (CudaOps.x_bf16)."""

    def parts(ws):
        return [(w.data, w.qtype, w.shape) for w in ws]

    experts = upload_experts(
        [parts(g) for g in moe.gate_up], parts(moe.down), x_bf16=x_bf16, stream=stream
    )
    return DeviceMoe(upload_router(moe.router), experts, experts)


class CudaMoeOps:
    """The MoeOps methods of CudaOps (it calls init_moe from its constructor)."""

    def init_moe(self, config: ModelConfig, max_tokens: int, buf) -> None:
        if not config.num_experts:
            return
        n, k, width = max_tokens, config.num_experts_per_tok, config.moe_intermediate_size
        self.router_logits = buf(n, config.num_experts)
        self.expert_ids = buf(n, k, dtype=np.int32)
        self.expert_weights = buf(n, k)
        self.expert_gate_up = buf(n * k, 2 * width)  # per (token, rank) pair
        self.expert_act = buf(n * k, width)
        self.expert_out = buf(n * k, config.hidden_size)
        self.expert_groups = PairGroups.create(n * k, config.num_experts, stream=self.stream)

    def route(self, x, router, top_k: int, renormalize: bool) -> tuple:
        T, s = self.T, self.stream
        if hasattr(x, "residual"):  # a DeferredNorm (cuda_ops), on a folded step
            out = self.x[:T]
            kernels.rms_norm(x.residual, x.weight, self.eps, out, stream=s)
            x = out
        logits = self.router_logits[:T]
        router.matmul(x, logits, x_scratch=self.x_scratch, stream=s)
        ids, weights = self.expert_ids[:T], self.expert_weights[:T]
        route_top_k(logits, renormalize, ids, weights, stream=s)
        return ids, weights, x

    def add_experts(self, x, routing, gate_up: DeviceExperts, down, h: Hidden) -> None:
        """x as route saw it (a deferred norm is in routing, run)."""
        ids, weights, x = routing
        T, s = self.T, self.stream
        pairs = T * ids.shape[1]
        act, ys, groups = self.expert_act[:pairs], self.expert_out[:pairs], self.expert_groups
        group_pairs(ids, groups, per_tile=gate_up.pairs_per_tile, stream=s)
        gate_up.gated_up(x, ids, groups, self.expert_gate_up[:pairs], act, stream=s)
        down.down_proj(act, ids, groups, ys, stream=s)
        if self.fold:  # the residual add in the combine (the module docstring)
            combine(ys, weights, h.residual, accumulate=True, stream=s)
            return
        out = self.h[:T]
        combine(ys, weights, out, stream=s)
        h.pending = out
