"""Checks vtllm's GGUF conventions for Gemma 2, Gemma 3 and Phi-3 against llama.cpp's own
converter, so that vtllm's writer and loader agree with llama.cpp and not merely with each
other (tests/models/test_gguf_families.py round-trips them).

    .venv/bin/python tests/goldens/check_gguf_conventions.py --llama-cpp DIR \\
        [--ref-python /work/venv-ref/bin/python] [--ref-path EXTRA_SITE_PACKAGES]

DIR is a llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/), e.g. the one inside the
llama-cpp-python sdist (`pip download --no-deps --no-binary :all: llama-cpp-python`); the
reference python has torch + transformers, and the converter also imports sentencepiece and
protobuf (--ref-path: a folder holding them, put on its PYTHONPATH).

For each tiny checkpoint of tests/models/gemma_tiny.py and phi3_tiny.py (Gemma 2 with
query_pre_attn_scalar = head_dim, which is all a GGUF can say; Gemma 3; Phi-3 with longrope
and a window; Phi-4-mini with partial rotary and tied embeddings), given a small
SentencePiece tokenizer.model (the converter's Gemma and Phi-3 vocabularies are SPM) and a
tokenizer_config.json with added tokens of each kind and a chat template, it runs
llama.cpp's converter and vtllm's writer twice (--outtype f32 / float32=True, and f16, the
writer's default), then compares:
- tensors: the same names, shapes, types and bytes (F16 matrices, F32 norms and factors);
- metadata: the same `<arch>.*` keys, the same vocabulary (tokenizer.ggml.*: pieces, scores,
  types, special ids, add_space_prefix), general.architecture and general.file_type, with
  the same values (the other general.* keys, which name the model, are not compared);
- and reads the converter's F32 file with vtllm's GGUF loader: the same ModelConfig and the same
  teacher-forced logits, bit for bit, as the safetensors checkpoint.
It exits 1 on any difference.

Result (llama.cpp of llama-cpp-python 0.3.36's sdist; torch 2.13 CPU, transformers 5.25):
all four models agree, in F32 and in F16, on every tensor (names, shapes, types, bytes:
Gemma's norms as 1 + w, Phi-3's fused attn_qkv / ffn_up, rope_factors_long / short) and
every architecture key (Gemma 2: soft-caps, sliding_window, no rope base; Gemma 3:
rope.freq_base and freq_base_swa, linear scaling factor 8, sliding_window; Phi-3:
rope.dimension_count 12 on Phi-4-mini, rope.scaling.attn_factor, original_context_length,
sliding_window 0 or 12), and the converter's F32 files load in vtllm to the safetensors
checkpoints' config and logits bits. The
keys only the converter writes: general.name / size_label / type / quantization_version.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import numpy as np
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.models import gemma_tiny, phi3_tiny  # noqa: E402
from tests.models.runner_util import make_runner, teacher_forced_logits  # noqa: E402
from tests.models.spm_util import training_lines  # noqa: E402
from vtllm.models.gguf_file import GGUFFile  # noqa: E402
from vtllm.models.gguf_writer import write_gguf  # noqa: E402
from vtllm.models.loader import load_model  # noqa: E402
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors  # noqa: E402

CASES = {  # name: (config, module with its tensors and prompt)
    "gemma2": ({**gemma_tiny.CONFIGS["gemma2"], "query_pre_attn_scalar": 16}, gemma_tiny),
    "gemma3": (gemma_tiny.CONFIGS["gemma3"], gemma_tiny),
    "phi3": (phi3_tiny.CONFIGS["phi3"], phi3_tiny),
    "phi4mini": (phi3_tiny.CONFIGS["phi4mini"], phi3_tiny),
}
# added tokens of each kind the converter tells apart: marked special, unmarked but looking
# special (Gemma: control), plain (user-defined; Gemma writes its spaces plain)
TOKENIZER_CONFIG = {
    "tokenizer_class": "LlamaTokenizer",
    "add_bos_token": True,
    "add_eos_token": False,
    "added_tokens_decoder": {
        "5": {"content": "<start_of_turn>", "special": True},
        "6": {"content": "<unused0>", "special": False},
        "7": {"content": "\u2581\u2581tab", "special": False},
        "299": {"content": "<|end|>", "special": True},
    },
    "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
}
GENERAL = ("general.architecture", "general.file_type")  # compared like the architecture's


def uncompared(key: str) -> bool:
    """The keys that name the model (see the docstring)."""
    return key.startswith("general.") and key not in GENERAL


def small_spm() -> bytes:
    """A SentencePiece model smaller than the tiny vocabularies (the converter pads it)."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines(n=300)),
        model_writer=out,
        model_type="bpe",
        vocab_size=200,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def make_checkpoint(directory: Path, name: str, spm_model: bytes) -> Path:
    config, tiny = CASES[name]
    directory.mkdir(parents=True)
    save_safetensors(directory / "model.safetensors", tiny.tensors(name))
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = byte_tokenizer_json(config["vocab_size"])
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer.model").write_bytes(spm_model)
    (directory / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return directory


def convert(args, checkpoint: Path, out: Path, outtype: str) -> None:
    llama_cpp = Path(args.llama_cpp)
    paths = [str(llama_cpp / "gguf-py"), *([args.ref_path] if args.ref_path else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [args.ref_python, str(llama_cpp / "convert_hf_to_gguf.py"), str(checkpoint)]
    command += ["--outfile", str(out), "--outtype", outtype]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"convert_hf_to_gguf.py failed on {checkpoint}:\n{done.stderr[-3000:]}")


def compare_files(ours: GGUFFile, theirs: GGUFFile) -> list[str]:
    problems = []
    mine, ref = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    for name in sorted(set(mine) ^ set(ref)):
        problems.append(f"tensor {name} only in {'vtllm' if name in mine else 'llama.cpp'}'s")
    for name in sorted(set(mine) & set(ref)):
        a, b = mine[name], ref[name]
        if (a.shape, a.type) != (b.shape, b.type):
            problems.append(f"tensor {name}: {a.shape} type {a.type} vs {b.shape} type {b.type}")
        elif not np.array_equal(a.data, b.data):
            problems.append(f"tensor {name}: other values")
    keys = lambda f: {k for k in f.fields if not uncompared(k)}  # noqa: E731
    for key in sorted(keys(ours) ^ keys(theirs)):
        problems.append(f"key {key} only in {'vtllm' if key in ours.fields else 'llama.cpp'}'s")
    for key in sorted(keys(ours) & keys(theirs)):
        if ours.fields[key] != theirs.fields[key]:
            problems.append(f"key {key}: {ours.fields[key]!r} vs {theirs.fields[key]!r}")
    return problems


def compare_models(converted: Path, checkpoint: Path, name: str) -> list[str]:
    """The converter's file, read by vtllm, against the safetensors checkpoint."""
    gguf, hf = load_model(converted), load_model(checkpoint)
    a, b = msgspec.structs.asdict(gguf.config), msgspec.structs.asdict(hf.config)
    problems = []
    if np.float32(a.pop("rms_norm_eps")) != np.float32(b.pop("rms_norm_eps")):
        problems.append("config rms_norm_eps differs")
    problems += [f"config {k}: {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k]]
    ids = CASES[name][1].prompt(name)
    run = lambda m: teacher_forced_logits(make_runner(m, max_model_len=64), ids, [len(ids)])  # noqa: E731
    if not np.array_equal(run(gguf), run(hf)):
        problems.append("logits differ from the safetensors checkpoint's")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp source tree")
    parser.add_argument("--ref-python", default="/work/venv-ref/bin/python")
    parser.add_argument("--ref-path", default="", help="extra PYTHONPATH for the converter")
    args = parser.parse_args()
    spm_model = small_spm()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            checkpoint = make_checkpoint(Path(tmp) / name, name, spm_model)
            problems, theirs = [], None
            for outtype in ("f32", "f16"):
                converted = Path(tmp) / f"{name}.llama-cpp.{outtype}.gguf"
                ours = Path(tmp) / f"{name}.{outtype}.gguf"
                convert(args, checkpoint, converted, outtype)
                write_gguf(checkpoint, ours, float32=outtype == "f32")
                theirs = GGUFFile(converted)
                found = compare_files(GGUFFile(ours), theirs)
                problems += [f"{outtype}: {problem}" for problem in found]
                if outtype == "f32":
                    problems += compare_models(converted, checkpoint, name)
            only_theirs = sorted(k for k in theirs.fields if uncompared(k))
            print(
                f"{name}: {len(theirs.tensors)} tensors, "
                f"{sum(not uncompared(k) for k in theirs.fields)} keys: "
                + ("the same" if not problems else f"{len(problems)} differences")
            )
            print(f"  not compared: {', '.join(only_theirs)}")
            for problem in problems:
                print(f"  {problem}")
            failed |= bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
