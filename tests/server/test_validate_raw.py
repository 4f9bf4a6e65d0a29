"""Prompts and messages arrive undecoded (protocol.py): what validate.py reads from their
bytes alone must agree with what decoding them would say."""

import msgspec
import pytest

from vtllm.errors import ContextLengthExceeded, InvalidParameter
from vtllm.server.protocol import ChatCompletionRequest, CompletionRequest
from vtllm.server.validate import _too_many_ids, chat_messages, completion_prompts


def _raw_text(text: bytes) -> msgspec.Raw:
    return msgspec.json.decode(b'{"v": ' + text + b"}", type=dict[str, msgspec.Raw])["v"]


def _raw(value) -> msgspec.Raw:
    return _raw_text(msgspec.json.encode(value))


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (b"[1,2,3,4,5,6]", 6),
        (b"[ 1 ,\n -2,\t3, 4, 5 ,6 ]", 6),
        (b"[" + b"7," * 99 + b"7]", 100),
    ],
)
def test_a_flat_id_list_is_counted_from_its_bytes(text, count):
    raw = _raw_text(text)
    assert _too_many_ids(raw, count - 1) == count
    assert _too_many_ids(raw, count) is None  # not more than the context: decoded as usual


@pytest.mark.parametrize(
    "value",
    [
        [1, "a,b,c,d,e,f,g,h"],  # commas inside a string are not ids
        [[1, 2, 3, 4], [5, 6, 7, 8]],  # prompts of ids: counted one by one once decoded
        [1, 2.5, 3, 4, 5, 6, 7, 8],
        [1, True, 3, 4, 5, 6, 7, 8],
        "1,2,3,4,5,6,7,8,9",
    ],
)
def test_other_shapes_are_left_to_the_decoder(value):
    assert _too_many_ids(_raw(value), 3) is None


def _completion(prompt) -> CompletionRequest:
    return msgspec.json.decode(msgspec.json.encode({"prompt": prompt}), type=CompletionRequest)


def test_the_byte_count_refuses_like_the_decoded_list():
    for prompt in ([5] * 40, [[5] * 40]):  # flat: from bytes; nested: after decoding
        with pytest.raises(ContextLengthExceeded, match="holds 40 tokens") as info:
            completion_prompts(_completion(prompt), None, 100, 1000, max_len=32)
        assert info.value.param == "prompt"
    assert completion_prompts(_completion([5] * 32), None, 100, 1000, max_len=32) == [[5] * 32]


def test_an_absent_or_null_prompt_is_required():
    for req in (msgspec.json.decode(b"{}", type=CompletionRequest), _completion(None)):
        with pytest.raises(InvalidParameter, match="prompt is required"):
            completion_prompts(req, None, 100, 1000)


def test_a_number_out_of_range_names_its_place():
    req = msgspec.json.decode(b'{"prompt": [1, 1e400]}', type=CompletionRequest)
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.prompt\[1\]`"):
        completion_prompts(req, None, 100, 1000)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (None, "non-empty list"),
        ("hi", "non-empty list"),
        ([], "non-empty list"),
        ([{"role": "user", "content": "x"}] * 2049, "at most 2048 messages"),
    ],
)
def test_messages_are_counted_before_they_are_decoded(messages, message):
    body = {} if messages is None else {"messages": messages}
    req = msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)
    with pytest.raises(InvalidParameter, match=message):
        chat_messages(req, 1000)


def test_messages_decode_to_what_the_template_reads():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    req = msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)
    assert chat_messages(req, 1000) == [{"role": "user", "content": "hi"}]
