"""Writes phi3_references.json: HF transformers' logits and greedy tokens of the tiny random
checkpoints of tests/models/phi3_tiny.py (Phi3ForCausalLM twice, a windowed
MistralForCausalLM, a Qwen2ForCausalLM windowed from its second layer), float32 on the CPU with
eager attention; and confirms the e4m3 table of phi3_tiny.e4m3_by_formula against
torch.float8_e4m3fn.

    /work/venv-ref/bin/python tests/goldens/make_phi3_references.py   # torch + transformers

Per model, as make_family_references.py writes them (whose helpers this reuses): the weights'
sha256, the prompt, 32 greedy tokens from HF's KV-cached decode loop, and one teacher-forced
pass over prompt + tokens without a cache (per row the top-8 ids and logits, and the margin).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.goldens.make_family_references import TOP_K, floats, greedy  # noqa: E402
from tests.models.phi3_tiny import (  # noqa: E402
    CONFIGS,
    digest,
    e4m3_by_formula,
    e4m3_digest,
    prompt,
    tensors,
)

_CLASSES = {
    "Phi3ForCausalLM": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    "MistralForCausalLM": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "Qwen2ForCausalLM": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}


def build(name: str):
    raw = CONFIGS[name]
    config_cls, model_cls = _CLASSES[raw["architectures"][0]]
    cfg = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype")}
    config = config_cls(**cfg)
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    arrays = tensors(name)
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = raw["tie_word_embeddings"]
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (
        missing,
        unexpected,
    )
    if tied:
        model.tie_weights()
        assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    return model, digest(arrays)


def check_e4m3_table() -> None:
    """The bit formula's 256 values are torch's decode of the same bytes, NaN where it is."""
    ours = e4m3_by_formula()
    theirs = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan) and nan.sum() == 2
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.nanmax(theirs) == 448.0


def main() -> None:
    torch.manual_seed(0)
    check_e4m3_table()
    out = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "e4m3_table_sha256": e4m3_digest(),  # checked against torch.float8_e4m3fn above
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
    path = Path(__file__).with_name("phi3_references.json")
    path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
