"""Catalog row 30 and fault F8: a chat template that raises fails only that request, with a 400
naming messages, before the engine sees anything. The default model's template never raises,
so the app runs in-process here with hostile templates swapped in."""

import copy

import pytest
from starlette.testclient import TestClient

from vtllm.config import resolve
from vtllm.server.app import build_app
from vtllm.server.engine import build_state

CC = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]


@pytest.fixture(scope="module")
def state():
    config, _ = resolve(env={}, kv_cache_memory=8 << 20, max_model_len=256)
    state = build_state(config)
    state.status = "ok"
    yield state
    state.engine.backend.close()


TEMPLATES = [
    # what HF templates do to refuse a conversation
    ("raise-exception", "{{ raise_exception('Conversation roles must alternate') }}", "alternate"),
    ("undefined-call", "{{ messages.nope() }}", "chat template"),
    ("sandbox-escape", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "chat template"),
    ("huge-range", "{% for i in range(10**9) %}x{% endfor %}", "chat template"),
    ("type-error", "{{ messages[0]['content'] + 1 }}", "chat template"),
    ("syntax-error", "{% for %}", "chat template"),
    ("blow-up", "{% for i in range(99999) %}{{ messages }}{% endfor %}", "too long"),
]


@pytest.mark.parametrize(
    ("source", "said"), [t[1:] for t in TEMPLATES], ids=[t[0] for t in TEMPLATES]
)
def test_template_that_raises_is_a_400_and_engine_untouched(state, source, said):
    tokenizer = copy.copy(state.tokenizer)
    tokenizer.chat_template = source
    hostile = copy.copy(state)
    hostile.tokenizer = tokenizer
    added = state.engine.loop.num_added
    with TestClient(build_app(hostile)) as client:
        for stream in (False, True):
            r = client.post(CC, json={"messages": MSG, "max_tokens": 2, "stream": stream})
            assert r.status_code == 400, r.text
            assert r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert error["param"] == "messages" and said in error["message"]
            assert len(error["message"]) <= 512
    assert state.engine.loop.num_added == added
    assert state.engine.scheduler.num_used_blocks == 0
