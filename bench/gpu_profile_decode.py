"""Where a decode step's time goes on the GPU: the whole step's graph, each op alone, and the
host. From the repo root, on a machine with an NVIDIA GPU and the [cuda] extra:
    python -m bench.gpu_profile_decode CHECKPOINT_DIR [--batch 1] [--mixed 128]
    python -m bench.gpu_profile_decode CHECKPOINT_DIR --prefill 1024 [--seqs 1] [--dtype float32]
--mixed P profiles a decode step of the batch that also prefills a P-token prompt (a serving
step under load). --prefill N profiles the prefill of N prompt tokens in --seqs prompts instead
(its wall time with the step's graph and eagerly, the graph alone, each op over the step's
tokens). Each GPU figure is a CUDA graph of 20 back-to-back launches replayed 5 times, median
per launch, so Python launch overhead is not in it. Host figures time the runner's own calls:
launch() alone, a synchronous step, and a depth-2 step (the next step launched before the
last is read, as the engine runs them); --host-profile N adds cProfile's table of N launches."""

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np
from numba import cuda

from vtllm.executor.cuda_graphs import CudaGraph
from vtllm.executor.cuda_ops import FOLD_TOKENS
from vtllm.executor.cuda_runner import CudaModelRunner
from vtllm.kernels import cuda as ops
from vtllm.kernels.cuda._linear_mma import linear_mma
from vtllm.kernels.cuda.attention import ROPE_TOKENS, fuses_rope, qkv_rope, rope_attention
from vtllm.models.loader import load_model
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams


def gpu_us(stream, fn, reps=20, rounds=5, *, capture=True) -> float:
    """Median GPU time of fn's launches; capture=False for fn that is itself a graph replay
    (graphs cannot be launched into a capture; their launches are cheap enough to time)."""
    fn()
    stream.synchronize()
    graph = CudaGraph(stream, lambda: [fn() for _ in range(reps)]) if capture else None
    times = []
    for _ in range(rounds):
        a, b = cuda.event(), cuda.event()
        a.record(stream)
        if graph is None:
            for _ in range(reps):
                fn()
        else:
            graph.replay()
        b.record(stream)
        b.synchronize()
        times.append(cuda.event_elapsed_time(a, b) * 1e3 / reps)
    if graph is not None:
        graph.close()
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--kquant-tensor-cores",
        action="store_true",
        help="K-quant matrices on the tensor cores (VT_CUDA_KQUANT_TENSOR_CORES)",
    )
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--prefill", type=int, default=0, help="profile an N-token prefill")
    p.add_argument("--mixed", type=int, default=0, help="decode steps also prefill P tokens")
    p.add_argument("--seqs", type=int, default=1, help="prompts the prefill's tokens are split in")
    p.add_argument(
        "--split-rows",
        type=int,
        default=0,
        help="the runner's split_attention_rows (VT_CUDA_SPLIT_ATTENTION_ROWS)",
    )
    p.add_argument(
        "--host-profile",
        type=int,
        default=0,
        help="cProfile N launch() calls and print where the host's time goes",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("float32", "bfloat16"),
        help="KV cache and matmul inputs (bfloat16: the default on cuda)",
    )
    args = p.parse_args()
    if args.prefill:
        args.batch, args.context = args.seqs, args.prefill // args.seqs
    loaded = load_model(args.model)
    c = loaded.config
    B, ctx = args.batch, args.context
    runner = CudaModelRunner(
        loaded,
        block_size=16,
        max_num_seqs=max(8, B + 1),
        max_model_len=4096,
        max_num_batched_tokens=max(2048, B * ctx),
        kv_cache_memory=4 << 30,
        kv_cache_fraction=0.0,
        use_graphs=True,
        kv_cache_dtype=args.dtype,
        matmul_input_dtype=args.dtype,
        split_attention_rows=args.split_rows,
        cuda_kquant_tensor_cores=args.kquant_tensor_cores,
    )
    # B requests with ctx tokens each, prefilled, then decode steps
    per = -(-(ctx + 200) // 16)
    plan = StepPlan(
        0,
        [
            SeatedRequest(
                i,
                list(range(3, 3 + ctx)),
                ctx,
                SamplingParams(temperature=0.0),
                0,
                list(range(i * per, (i + 1) * per)),
            )
            for i in range(B)
        ],
        [Chunk(i, 0, ctx, [], sample=True) for i in range(B)],
        [],
    )
    runner.execute(plan)
    if args.prefill:
        return profile_prefill(runner, plan)
    step = [1]
    P = args.mixed  # a prompt in slot B, seated again every step
    newcomer = SeatedRequest(
        B,
        list(range(5, 5 + P)),
        P,
        SamplingParams(temperature=0.0),
        0,
        list(range(B * per, B * per + -(-P // 16))),
    )

    def decode_plan():
        n = ctx + step[0]
        step[0] += 1
        chunks = [Chunk(i, n - 1, 1, [], sample=True) for i in range(B)]
        if not P:
            return StepPlan(step[0], [], chunks, [])
        return StepPlan(step[0], [newcomer], [*chunks, Chunk(B, 0, P, [], sample=True)], [B])

    for _ in range(3):
        runner.execute(decode_plan())
    host = []
    for _ in range(50):
        t0 = time.perf_counter()
        pending = runner.launch(decode_plan())
        host.append(time.perf_counter() - t0)
        runner.finish(pending)
    t0 = time.perf_counter()
    for _ in range(50):
        runner.execute(decode_plan())
    sync_step = (time.perf_counter() - t0) / 50
    # as the engine runs it: the next step launched before the last one is read (depth 2)
    t0 = time.perf_counter()
    pending = runner.launch(decode_plan())
    for _ in range(50):
        following = runner.launch(decode_plan())
        runner.finish(pending)
        pending = following
    runner.finish(pending)
    depth2_step = (time.perf_counter() - t0) / 51
    if args.host_profile:
        host_profile(runner, decode_plan, args.host_profile)
    bucket = next(b for b in runner.buckets if b >= B + P)
    graph = runner.graphs[bucket]
    s = runner.stream
    whole = gpu_us(s, graph.replay, reps=10, capture=False)
    print(
        f"model {c.num_layers} layers hidden {c.hidden_size} vocab {c.vocab_size}; batch {B} "
        f"context {ctx}, prefill {P}; graph nodes {graph.num_nodes}"
    )
    print(f"decode step graph (GPU): {whole:8.1f} us")
    print(f"host launch() median:    {1e6 * statistics.median(host):8.1f} us")
    print(f"synchronous step:        {1e6 * sync_step:8.1f} us")
    print(f"depth-2 step (wall):     {1e6 * depth2_step:8.1f} us")

    if P:
        return staged_op_rows(runner, bucket)
    views = runner._layout(bucket, bucket, bucket, bucket)[1]
    op_rows(runner, B, B, views)


def host_profile(runner, make_plan, n):
    """cProfile of n launch() calls, each after the last step finished: the host's own cost."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for _ in range(n):
        plan = make_plan()
        prof.enable()
        pending = runner.launch(plan)
        prof.disable()
        runner.finish(pending)
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def profile_prefill(runner, plan):
    """Wall time of the prefill step (graph, then eager), its graph alone, then each op."""
    T = sum(chunk.num_tokens for chunk in plan.chunks)
    freed = list(range(len(plan.seated)))  # every slot freed and seated again
    again = StepPlan(1, plan.seated, plan.chunks, freed)
    wall = {}
    for graphs in (False, True):
        runner.use_graphs = graphs
        runner.execute(again)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            runner.execute(again)
            times.append(time.perf_counter() - t0)
        wall[graphs] = statistics.median(times)
    bucket = next(b for b in runner.buckets if b >= T)
    graph = runner.graphs[bucket]
    whole = gpu_us(runner.stream, graph.replay, reps=3, capture=False)
    c = runner.config
    print(
        f"model {c.num_layers} layers hidden {c.hidden_size} vocab {c.vocab_size}; prefill "
        f"{T} tokens of {len(plan.chunks)} prompts in bucket {bucket}; "
        f"graph nodes {graph.num_nodes}"
    )
    print(f"prefill step, eager (wall):  {1e3 * wall[False]:9.2f} ms")
    print(f"prefill step, graph (wall):  {1e3 * wall[True]:9.2f} ms")
    print(f"prefill graph alone (GPU):   {whole / 1e3:9.2f} ms")
    staged_op_rows(runner, bucket)


def staged_op_rows(runner, bucket):
    """op_rows over the step last staged in this bucket's graph (its metadata, its rows)."""
    from vtllm.executor.step_layout import graph_counts

    counts = graph_counts(bucket, runner.max_num_seqs)
    op_rows(runner, bucket, counts[2], runner._layout(*counts)[1])


def op_rows(runner, T, R, views):
    """Each op of one layer (and the head) over T token rows (R logits rows) in a graph of
    its own; `views` hold the staged step's metadata (what attention reads)."""
    m, c, s, B = runner.ops, runner.config, runner.stream, T
    lay = runner.model.w.layers[0]
    x, qkv, h = m.x[:B], m.qkv[:B], m.h[:B]
    rng = np.random.default_rng(0)
    x.copy_to_device(rng.standard_normal(x.shape).astype(np.float32))
    n = c.num_layers
    inp = runner._inputs(views)
    fold = m.foldable and B <= FOLD_TOKENS  # the norms in the linears (executor/cuda_ops)
    n_plain = 0 if fold else n  # rows a folded step does not run are timed, counted x 0
    fusable = fuses_rope(c.num_heads, c.num_kv_heads, c.head_dim)
    in_attention = fusable and B <= ROPE_TOKENS  # qkv_rope in attention's kernel
    n_unfused = 0 if in_attention else n
    res, attn2d, eps = m.residual[:B], m.attn[:B].reshape(B, c.q_size), c.rms_norm_eps
    res.copy_to_device(rng.standard_normal(res.shape).astype(np.float32))
    rows = [
        (
            "rms_norm (+residual)",
            2 * n_plain + 1,
            lambda: ops.rms_norm(h, lay.ffn_norm, 1e-6, x, residual=m.residual[:B], stream=s),
        ),
        ("linear qkv", n_plain, lambda: lay.qkv.matmul(x, qkv, x_scratch=m.x_scratch, stream=s)),
        ("linear o", n_plain, lambda: lay.o.matmul(attn2d, h, x_scratch=m.x_scratch, stream=s)),
        (
            "gate_up + SwiGLU",
            n_plain,
            lambda: lay.gate_up.matmul(
                x, m.gate_up[:B], x_scratch=m.x_scratch, act=m.act[:B], stream=s
            ),
        ),
        (
            "linear down",
            n_plain,
            lambda: lay.down.matmul(m.act[:B], h, x_scratch=m.x_scratch, stream=s),
        ),
        (
            "qkv_rope (+q/k norm)",
            n_unfused,
            lambda: qkv_rope(
                qkv,
                m.q[:B],
                m.kv_k[0],
                m.kv_v[0],
                inp.slot_mapping,
                inp.positions,
                m.cos_sin,
                1e-6,
                q_norm=lay.q_norm,
                k_norm=lay.k_norm,
                stream=s,
            ),
        ),
        (
            "paged_attention",
            n_unfused,
            lambda: ops.paged_attention(
                m.q[:B],
                m.kv_k[0],
                m.kv_v[0],
                inp.block_tables,
                inp.seq_lens,
                inp.query_start_loc,
                m.scale,
                m.attn[:B],
                scratch=m.attn_scratch,
                stream=s,
            ),
        ),
        (
            "lm_head",
            1,
            lambda: runner.model.w.lm_head.matmul(
                m.final[:R], m.logits[:R], x_scratch=m.x_scratch, stream=s
            ),
        ),
        ("sample (greedy)", 1, lambda: runner._sample(m.logits[:R], views, R)),
    ]
    if fold:
        rows += [
            (
                "qkv, norm folded",
                n,
                lambda: linear_mma(
                    res, lay.qkv.data, qkv, norm_weight=lay.attn_norm, eps=eps, stream=s
                ),
            ),
            (
                "o, += residual",
                n,
                lambda: linear_mma(attn2d, lay.o.data, res, accumulate=True, stream=s),
            ),
            (
                "gate_up, norm + SwiGLU",
                n,
                lambda: linear_mma(
                    res,
                    lay.gate_up.data,
                    m.act[:B],
                    swiglu=True,
                    norm_weight=lay.ffn_norm,
                    eps=eps,
                    stream=s,
                ),
            ),
            (
                "down, += residual",
                n,
                lambda: linear_mma(m.act[:B], lay.down.data, res, accumulate=True, stream=s),
            ),
        ]
    if in_attention:
        rows.append(
            (
                "rope_attention",
                n,
                lambda: rope_attention(
                    qkv,
                    m.kv_k[0],
                    m.kv_v[0],
                    inp.slot_mapping,
                    inp.positions,
                    m.cos_sin,
                    1e-6,
                    inp.block_tables,
                    inp.seq_lens,
                    inp.query_start_loc,
                    m.scale,
                    m.attn[:B],
                    m.attn_scratch,
                    q_norm=lay.q_norm,
                    k_norm=lay.k_norm,
                    stream=s,
                ),
            )
        )
    if lay.moe is not None:  # a routed layer: the router and the experts replace gate_up / down
        rows = [r for r in rows if "gate_up" not in r[0] and "down" not in r[0]]
        rows += moe_rows(runner, lay, x, res, B, n)
    total = 0.0
    print(f"{'op':24s} {'us each':>9s} {'per step':>9s} {'x':>4s}")
    for name, count, fn in rows:
        us = gpu_us(s, fn)
        total += us * count
        print(f"{name:24s} {us:9.1f} {us * count:9.1f} {count:4d}")
    print(f"{'sum of ops':24s} {'':9s} {total:9.1f}")


def moe_rows(runner, lay, x, res, B, n):
    """The routed experts of a MoE layer over B tokens: the router with its top-k, then the
    grouped gate_up / SwiGLU / down and the weighted combine into the residual stream."""
    m, c, moe = runner.ops, runner.config, lay.moe
    m.T = B
    k, renorm = c.num_experts_per_tok, c.norm_topk_prob
    routing = m.route(x, moe.router, k, renorm)
    hidden = SimpleNamespace(residual=res, pending=None)
    return [
        ("moe router + top-k", n, lambda: m.route(x, moe.router, k, renorm)),
        ("moe experts", n, lambda: m.add_experts(x, routing, moe.gate_up, moe.down, hidden)),
    ]


if __name__ == "__main__":
    main()
