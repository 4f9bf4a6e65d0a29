"""The BERT family forward (BertModel: all-MiniLM, bge, e5 and other sentence encoders): the
only one, over an encoder op interface that a backend implements (executor/cpu_encoder_ops).

Post-norm encoder layers: embeddings (word + position + token type) and a layer norm; per layer,
self-attention of every token to every token of its sequence, the output projection added to
the residual and normalized, then a GELU MLP added and normalized. Sentence embeddings pool the
last hidden states as the checkpoint's sentence-transformers files say (mean, CLS or last token;
then L2-normalized when a Normalize module follows).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.kernels import QType
from vtllm.models.weights import Weight

ENCODER_ARCHITECTURES = {"BertModel", "BertForMaskedLM", "BertForPreTraining"}


class BertConfig(msgspec.Struct, frozen=True):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pooling: str  # "mean", "cls" or "last"
    normalize: bool
    max_seq_length: int  # sentence-transformers' cut (<= max_positions)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(slots=True)
class EncoderLayer:
    qkv: Weight  # [3 * hidden, hidden]: query, key, value stacked
    qkv_bias: np.ndarray
    o: Weight
    o_bias: np.ndarray
    attn_norm: tuple[np.ndarray, np.ndarray]  # (weight, bias) after attention
    up: Weight
    up_bias: np.ndarray
    down: Weight
    down_bias: np.ndarray
    ffn_norm: tuple[np.ndarray, np.ndarray]


@dataclass(slots=True)
class EncoderWeights:
    word: np.ndarray  # float32 [vocab, hidden]
    position: np.ndarray  # [max_positions, hidden]
    token_type: np.ndarray  # [type_vocab, hidden]
    embed_norm: tuple[np.ndarray, np.ndarray]
    layers: list[EncoderLayer]


class EncoderOps(Protocol):
    """What a BERT forward asks of a backend; arrays are the backend's."""

    def embeddings(self, w: EncoderWeights, ids, positions, eps: float) -> object:
        """LayerNorm(word[ids] + position[positions] + token_type[0]): [T, hidden]."""

    def linear(self, x, weight: Weight, bias) -> object:
        """x @ W.T + bias."""

    def attention(self, qkv, starts, num_heads: int, head_dim: int) -> object:
        """Every token to every token of its sequence: [T, hidden]."""

    def add_norm(self, x, residual, norm, eps: float) -> object:
        """LayerNorm(x + residual) * weight + bias."""

    def gelu(self, x) -> object:
        """x * Phi(x), in place."""


def is_encoder(path: Path) -> bool:
    """Whether a model directory holds an encoder this module runs."""
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any(a in ENCODER_ARCHITECTURES for a in architectures)


def read_config(path: Path) -> BertConfig:
    raw = json.loads((path / "config.json").read_text())
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModel(
            f"{path}: position_embedding_type {raw['position_embedding_type']!r} (absolute only)"
        )
    if raw.get("hidden_act", "gelu") != "gelu":
        raise UnsupportedModel(f"{path}: hidden_act {raw['hidden_act']!r} (gelu only)")
    pooling, normalize = _sentence_transformers(path)
    max_positions = raw["max_position_embeddings"]
    st = path / "sentence_bert_config.json"
    cut = json.loads(st.read_text()).get("max_seq_length") if st.is_file() else None
    return BertConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=raw["num_attention_heads"],
        intermediate_size=raw["intermediate_size"],
        max_positions=max_positions,
        type_vocab_size=raw.get("type_vocab_size", 2),
        layer_norm_eps=raw.get("layer_norm_eps", 1e-12),
        pooling=pooling,
        normalize=normalize,
        max_seq_length=min(cut or max_positions, max_positions),
    )


def _sentence_transformers(path: Path) -> tuple[str, bool]:
    """(pooling, normalize) from modules.json and the Pooling module's config; mean pooling,
    unnormalized, for a plain BertModel directory."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return "mean", False
    modules = json.loads(modules_file.read_text())
    pooling, normalize = "mean", False
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Pooling"):
            cfg = json.loads((path / module["path"] / "config.json").read_text())
            if cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_lasttoken"):
                pooling = "last"
            elif not cfg.get("pooling_mode_mean_tokens", True):
                raise UnsupportedModel(f"{path}: pooling {cfg} (mean, cls or last token only)")
        elif kind.endswith("Normalize"):
            normalize = True
    return pooling, normalize


def load_weights(path: Path, config: BertConfig) -> EncoderWeights:
    from safetensors.numpy import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no .safetensors files")
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

    def t(name: str) -> np.ndarray:
        try:
            return np.ascontiguousarray(tensors[prefix + name], np.float32)
        except KeyError:
            raise ModelLoadError(f"{path}: tensor {prefix + name} missing") from None

    def mat(name: str) -> Weight:
        a = t(name + ".weight")
        return Weight(a, QType.F32, a.shape)

    def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
        return t(name + ".weight"), t(name + ".bias")

    layers = []
    for i in range(config.num_layers):
        p = f"encoder.layer.{i}."
        a = p + "attention."
        qkv = np.concatenate([t(a + f"self.{n}.weight") for n in ("query", "key", "value")])
        layers.append(
            EncoderLayer(
                qkv=Weight(np.ascontiguousarray(qkv), QType.F32, qkv.shape),
                qkv_bias=np.concatenate(
                    [t(a + f"self.{n}.bias") for n in ("query", "key", "value")]
                ),
                o=mat(a + "output.dense"),
                o_bias=t(a + "output.dense.bias"),
                attn_norm=norm(a + "output.LayerNorm"),
                up=mat(p + "intermediate.dense"),
                up_bias=t(p + "intermediate.dense.bias"),
                down=mat(p + "output.dense"),
                down_bias=t(p + "output.dense.bias"),
                ffn_norm=norm(p + "output.LayerNorm"),
            )
        )
    return EncoderWeights(
        word=t("embeddings.word_embeddings.weight"),
        position=t("embeddings.position_embeddings.weight"),
        token_type=t("embeddings.token_type_embeddings.weight"),
        embed_norm=norm("embeddings.LayerNorm"),
        layers=layers,
    )


class BertModel:
    def __init__(self, config: BertConfig, weights: EncoderWeights, ops: EncoderOps):
        self.config, self.w, self.ops = config, weights, ops

    def forward(self, sequences: list[list[int]]) -> np.ndarray:
        """Sentence embeddings [S, hidden] float32 of token-id sequences (each already cut to
        max_seq_length, special tokens included)."""
        c, ops, w = self.config, self.ops, self.w
        lengths = np.array([len(s) for s in sequences], np.int64)
        starts = np.zeros(len(sequences) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        ids = np.fromiter((t for s in sequences for t in s), np.int64, int(starts[-1]))
        positions = np.concatenate([np.arange(n) for n in lengths])
        h = ops.embeddings(w, ids, positions, c.layer_norm_eps)
        for layer in w.layers:
            qkv = ops.linear(h, layer.qkv, layer.qkv_bias)
            attn = ops.attention(qkv, starts, c.num_heads, c.head_dim)
            h = ops.add_norm(
                ops.linear(attn, layer.o, layer.o_bias), h, layer.attn_norm, c.layer_norm_eps
            )
            up = ops.gelu(ops.linear(h, layer.up, layer.up_bias))
            h = ops.add_norm(
                ops.linear(up, layer.down, layer.down_bias), h, layer.ffn_norm, c.layer_norm_eps
            )
        return pool(np.asarray(h), starts, c.pooling, c.normalize)


def pool(h: np.ndarray, starts: np.ndarray, how: str, normalize: bool) -> np.ndarray:
    """One vector per sequence of the last hidden states (float64 sums, float32 out)."""
    out = np.empty((len(starts) - 1, h.shape[1]), np.float32)
    for s in range(len(starts) - 1):
        rows = h[starts[s] : starts[s + 1]].astype(np.float64)
        if how == "cls":
            v = rows[0]
        elif how == "last":
            v = rows[-1]
        else:
            v = rows.mean(axis=0)
        if normalize:
            v = v / max(np.linalg.norm(v), 1e-12)
        out[s] = v
    return out
