"""Stop strings and held-back text in TextStream, driven token by token."""

import pytest

from vtllm.engine.text import TextStream
from vtllm.scheduler.sampling_params import SamplingParams


def _run(tok, text, **params):
    stream = TextStream(tok, [], SamplingParams(**params))
    ids = tok.encode(text)
    sent = [stream.push([i], final=False) for i in ids]
    sent.append(stream.push([], final=True))
    return "".join(sent), stream.stopped_by, sent


@pytest.mark.parametrize("stop", [["world"], [", w"], ["o, w", "xyz"]])
def test_stop_string_cut_and_not_sent(default_model, stop):
    out, stopped, _ = _run(default_model.tokenizer, "Hello, world and more", stop=stop)
    assert stopped in stop
    assert out == "Hello, world and more"[: "Hello, world and more".find(stopped)]


def test_stop_string_included_when_asked(default_model):
    out, stopped, _ = _run(
        default_model.tokenizer,
        "Hello, world and more",
        stop=["world"],
        include_stop_str_in_output=True,
    )
    assert stopped == "world" and out == "Hello, world"


def test_text_that_may_become_a_stop_is_held_back(default_model):
    tok = default_model.tokenizer
    stream = TextStream(tok, [], SamplingParams(stop=["STOP NOW"]))
    first = stream.push(tok.encode("abc STOP"), final=False)
    assert "STOP" not in first  # could still become "STOP NOW"
    rest = stream.push(tok.encode(" later"), final=True)
    assert first + rest == "abc STOP later" and stream.stopped_by is None


def test_no_stops_streams_everything(default_model):
    out, stopped, sent = _run(default_model.tokenizer, "plain text here")
    assert out == "plain text here" and stopped is None and all(sent[:-1])


def test_held_text_stays_short_over_a_long_stream(default_model):
    tok = default_model.tokenizer
    stream = TextStream(tok, [], SamplingParams(stop=["never appears"]))
    ids = tok.encode("a long line of text, again and again. " * 200)
    sent = [stream.push([i], final=False) for i in ids]
    sent.append(stream.push([], final=True))
    assert "".join(sent) == tok.decode(ids) and stream.stopped_by is None
    # between pushes only what could still begin the stop string is kept
    stream = TextStream(tok, [], SamplingParams(stop=["never appears"]))
    for i in ids:
        stream.push([i], final=False)
        assert len(stream.pending) <= len("never appears") - 1


def test_an_output_cut_inside_a_character_ends_as_a_whole_decode_renders_it(default_model):
    tok = default_model.tokenizer
    ids = tok.encode("ok 🎉")
    cut = next(n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd"))
    stream = TextStream(tok, [], SamplingParams())
    sent = "".join(stream.push([i], final=False) for i in ids[:cut])
    assert "\ufffd" not in sent  # held back while more tokens may complete it
    assert sent + stream.push([], final=True) == tok.decode(ids[:cut])
