"""`python -m vtllm bench throughput`: many requests at once, depth 1 against depth 2."""

import time

import msgspec
import numpy as np

from vtllm.llm import LLM
from vtllm.scheduler.sampling_params import SamplingParams


def _run(llm: LLM, prompts, output_len: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    steps, host = llm.loop.num_steps, llm.loop.host_seconds
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    num_steps = llm.loop.num_steps - steps
    return {
        "requests_per_s": len(prompts) / elapsed,
        "output_tok_s": generated / elapsed,
        "steps": num_steps,
        "host_us_per_step": 1e6 * (llm.loop.host_seconds - host) / max(num_steps, 1),
    }


def bench_throughput(llm: LLM, num_prompts, input_len, output_len, concurrency) -> dict:
    vocab = llm.loaded.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, vocab, input_len).tolist() for _ in range(num_prompts)]
    report = {"num_prompts": num_prompts, "input_len": input_len, "output_len": output_len}
    # One step worker at a time: an idle worker's OpenMP team still costs the busy one time.
    llm.backend.close()
    for seats in concurrency:
        row = {}
        for depth in (1, 2):
            # every other setting as given (--device among them), these three varied
            knobs = msgspec.structs.asdict(llm.config) | {
                "async_depth": depth,
                "max_num_seqs": seats,
                "enable_prefix_caching": False,
            }
            bench_llm = LLM(loaded_model=llm.loaded, **knobs)
            _run(bench_llm, prompts[:2], 2)  # warm-up: compiled kernels, touched pages
            row[f"depth{depth}"] = _run(bench_llm, prompts, output_len)
            bench_llm.backend.close()
        row["depth2_over_depth1"] = row["depth2"]["output_tok_s"] / row["depth1"]["output_tok_s"]
        report[f"concurrency_{seats}"] = row
    return report
