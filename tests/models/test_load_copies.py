"""What loading a GGUF file copies: only the q/k/v matrices, whose rows llama.cpp permuted;
every other matrix, fused gate/up included, is a view of the file's memory map (its pages
shared with the page cache, counted once). docs/benchmarks/2026-12-07-cpu-memory.md."""

import subprocess
import sys

import numpy as np

from vtllm.kernels import QType
from vtllm.models import gguf_loader
from vtllm.models.weights import Weight, stacked_view


def _owns(w: Weight) -> bool:
    """The matrix holds bytes of its own (a copy) rather than viewing the file's map."""
    base = w.data
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.flags.owndata


def test_default_model_copies_only_permuted_qkv(default_model):
    weights = default_model.weights
    copied = [w for layer in weights.layers for w in (*layer.qkv, layer.o, *layer.gate_up)]
    copied += [layer.down for layer in weights.layers] + [weights.embed, weights.lm_head]
    copied = [w for w in copied if _owns(w)]
    assert copied == [w for layer in weights.layers for w in layer.qkv]

    tensors = {t.name: t for t in gguf_loader.open_gguf(default_model.path).tensors}
    for i in (0, len(weights.layers) - 1):
        gate_up = weights.layers[i].gate_up
        assert len(gate_up) == 1 and not _owns(gate_up[0])
        stored = [tensors[f"blk.{i}.ffn_{n}.weight"].data for n in ("gate", "up")]
        assert np.array_equal(gate_up[0].data.reshape(-1), np.concatenate(stored))


def test_stacked_view_only_over_back_to_back_matrices():
    buf = np.arange(5 * 40, dtype=np.uint8)
    a = Weight(buf[:80].reshape(2, 40), QType.Q4_1, (2, 64))
    b = Weight(buf[80:200].reshape(3, 40), QType.Q4_1, (3, 64))
    view = stacked_view([a, b])
    assert view.shape == (5, 64) and view.data.shape == (5, 40)
    assert np.shares_memory(view.data, buf) and np.array_equal(view.data.reshape(-1), buf)
    assert stacked_view([b, a]) is None  # out of order
    assert stacked_view([a, Weight(buf[120:200].reshape(2, 40), QType.Q4_1, (2, 64))]) is None
    assert stacked_view([a, Weight(b.data.copy(), QType.Q4_1, (3, 64))]) is None  # two buffers
    assert stacked_view([a, Weight(b.data, QType.Q4_0, (3, 64))]) is None  # two storage types


def test_loading_the_default_model_leaves_the_gguf_package_unimported():
    code = (
        "import sys\nfrom vtllm.models.loader import load_model\nload_model()\n"
        "print(sorted(m for m in ('gguf', 'yaml') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
