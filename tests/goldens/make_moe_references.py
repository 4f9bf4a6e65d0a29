"""Writes moe_references.json: HF transformers' logits and greedy tokens of the tiny random
checkpoints of tests/models/moe_tiny.py (Qwen3MoeForCausalLM, MixtralForCausalLM), float32 on
the CPU with eager attention and eager experts.

    /path/to/ref-venv/bin/python tests/goldens/make_moe_references.py

(the venv of make_family_references.py: torch, transformers, numpy, safetensors). Each
checkpoint is written under its hub tensor names (per-expert matrices; Mixtral's
block_sparse_moe w1 / w2 / w3) and loaded with from_pretrained, so transformers' own renaming
and fusing of the expert weights is what reads them. The JSON's layout is
family_references.json's (see that script).
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.goldens.make_family_references import TOP_K, floats, greedy  # noqa: E402
from tests.models.moe_tiny import CONFIGS, digest, prompt, tensors  # noqa: E402


def build(name: str, directory: Path):
    arrays = tensors(name)
    save_file(arrays, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(CONFIGS[name]))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    missing = set(info["missing_keys"]) - {"lm_head.weight"}
    assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"], info
    head = arrays.get("lm_head.weight", arrays["model.embed_tokens.weight"])
    assert np.array_equal(model.lm_head.weight.detach().numpy(), head)
    return model.eval(), digest(arrays)


def main() -> None:
    torch.manual_seed(0)
    out = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "models": {},
    }
    for name in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            model, sha = build(name, Path(tmp))
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
    path = Path(__file__).with_name("moe_references.json")
    path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
