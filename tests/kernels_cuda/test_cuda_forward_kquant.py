"""The CUDA runner on a tiny model stored as a GGUF K-quant mix stores it: q and k in Q4_K, v in
Q6_K (one qkv buffer, matmul.MixedRows: each part writes its columns), gate in Q4_K beside up in
Q5_K, the embedding in Q4_K (its GEMV lookup) and the head in Q6_K. Its logits agree with the
CPU runner's, which decodes the same blocks exactly (the steps of test_cuda_forward_sim), with
the matrices on their GEMVs and on the tensor cores (cuda_kquant_tensor_cores). The tensor-core
path takes x as hi + lo bf16 (about 2^-17 relative) where the GEMV takes float32 x: still far
inside the bound below."""

import dataclasses
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from tests.kernels_cuda.helpers import SIMULATOR
from tests.kernels_cuda.test_cuda_forward_sim import VOCAB, _cuda_runner, _logits, _plans
from tests.models.runner_util import make_runner
from vtllm.kernels import QType
from vtllm.models.gguf_quantize import encode
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, hf_config, write_random_safetensors
from vtllm.models.weights import Weight, weight_from_array

pytestmark = pytest.mark.cudasim


def _quantized(w: Weight, qtype: G) -> Weight:
    data, used = encode(w.data.astype(np.float32), qtype)
    assert used == qtype
    return weight_from_array(data, QType(int(used)), w.shape)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    out = tmp_path_factory.mktemp("kquant")
    config = hf_config("tiny", layers=1, vocab=VOCAB)
    config["hidden_size"] = 256  # every K-quant matrix's width a multiple of 256
    write_random_safetensors(out / "model.safetensors", config, seed=4, peaked=False, bf16=False)
    (out / "config.json").write_text(json.dumps(config))
    (out / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(VOCAB)))
    model = load_model(out)
    w = model.weights
    layer = w.layers[0]
    q, k, v = layer.qkv  # the safetensors loader keeps them apart; F32 [rows, 256] each
    gate, up = layer.gate_up
    layer.qkv = [_quantized(q, G.Q4_K), _quantized(k, G.Q4_K), _quantized(v, G.Q6_K)]
    layer.gate_up = [_quantized(gate, G.Q4_K), _quantized(up, G.Q5_K)]
    weights = dataclasses.replace(
        w, embed=_quantized(w.embed, G.Q4_K), lm_head=_quantized(w.lm_head, G.Q6_K)
    )
    return dataclasses.replace(model, weights=weights)


# ~8 minutes of the simulator since the GEMV stages x in shared memory per block: on the card
# only (make test-gpu); the simulator keeps every K-quant kernel's own cases (test_linear_kquant).
@pytest.mark.skipif(SIMULATOR, reason="on the card only: ~8 minutes under the simulator")
@pytest.mark.parametrize("kquant", [False, True], ids=["gemv", "tensor-cores"])
def test_kquant_mix_agrees_with_the_cpu_runner(loaded, kquant):
    plans = _plans(loaded.config.vocab_size)
    gpu = _logits(_cuda_runner(loaded, cuda_kquant_tensor_cores=kquant), plans)
    cpu = _logits(make_runner(loaded, max_model_len=64), plans)
    for g, c in zip(gpu, cpu, strict=True):
        scale = np.abs(c).max(axis=1, keepdims=True)
        assert np.max(np.abs(g - c) / scale) < 1e-3
        top2 = np.sort(c, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * scale[:, 0]
        assert (g.argmax(1) == c.argmax(1))[clear].all()
