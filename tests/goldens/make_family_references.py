"""Writes family_references.json: HF transformers' logits and greedy tokens of the tiny random
checkpoints of tests/models/gemma_tiny.py (Gemma2ForCausalLM, Gemma3ForCausalLM), float32 on
the CPU with eager attention.

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0      # the local CPU wheel
    .venv-ref/bin/pip install transformers==5.25.0 numpy==2.4.6
    .venv-ref/bin/python tests/goldens/make_family_references.py

Per model: the weights' sha256 (the test checks it draws the same arrays), the prompt, 32
greedy tokens from HF's own KV-cached decode loop (EOS does not stop it), and one
teacher-forced pass over prompt + tokens without a cache: per row its top-8 ids and logits
and the margin top1 - top2. Row i predicts token i + 1. Floats are float32 values written as
decimals that convert back exactly.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.models.gemma_tiny import CONFIGS, NEW_TOKENS, digest, prompt, tensors  # noqa: E402

TOP_K = 8


def build(name: str):
    cfg = {k: v for k, v in CONFIGS[name].items() if k not in ("architectures", "torch_dtype")}
    config_cls = {"gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}
    model_cls = {"gemma2": transformers.Gemma2ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM}
    config = config_cls[name](**cfg)
    config._attn_implementation = "eager"
    model = model_cls[name](config).eval()
    arrays = tensors(name)
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    return model, digest(arrays)


@torch.no_grad()
def greedy(model, ids: list[int]) -> list[int]:
    out = model(torch.tensor([ids]), use_cache=True)
    cache, tokens = out.cache, []
    for _ in range(NEW_TOKENS):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
        cache = out.cache
    return tokens


def floats(a) -> list:
    return [[float(str(np.float32(x))) for x in row] for row in a]


def main() -> None:
    torch.manual_seed(0)
    out = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "models": {},
    }
    for name in CONFIGS:
        model, sha = build(name)
        ids = prompt(name)
        tokens = greedy(model, ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids + tokens]), use_cache=False).logits[0].numpy()
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
        values = np.take_along_axis(logits, top, axis=1)
        out["models"][name] = {
            "weights_sha256": sha,
            "prompt_ids": ids,
            "output_ids": tokens,
            "top_ids": top.tolist(),
            "top_logits": floats(values),
            "margins": [float(str(np.float32(m))) for m in values[:, 0] - values[:, 1]],
        }
    path = Path(__file__).with_name("family_references.json")
    path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
