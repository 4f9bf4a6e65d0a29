"""Wall time of one wave of prompts prefilled together (max_tokens=1), the same token count split
into more and more prompts: does a step's cost grow with its number of prompts? From the repo
root, on a machine with an NVIDIA GPU and the [cuda] extra:
    python -m bench.gpu_prefill_wave CHECKPOINT_DIR [TOKENS]"""

import sys
import time

import numpy as np

from vtllm.llm import LLM
from vtllm.scheduler.sampling_params import SamplingParams


def main():
    model, tokens = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for graphs in (True, False):
        llm = LLM(
            model,
            device="cuda",
            enable_prefix_caching=False,
            max_num_seqs=64,
            max_num_batched_tokens=tokens,
            cuda_graphs=graphs,
        )
        llm.warm_up()
        for n in (1, 2, 4, 8, 16, 32):
            prompts = [rng.integers(100, 1000, tokens // n).tolist() for _ in range(n)]
            times = []
            for _ in range(3):
                steps = llm.loop.num_steps
                t0 = time.perf_counter()
                llm.generate(prompts, params)
                times.append((time.perf_counter() - t0, llm.loop.num_steps - steps))
            best = min(times)
            print(
                f"graphs {graphs!s:5} {n:3d} prompts x {tokens // n:5d} tokens: "
                f"{1e3 * best[0]:9.1f} ms in {best[1]} steps",
                flush=True,
            )
        llm.close()


if __name__ == "__main__":
    main()
