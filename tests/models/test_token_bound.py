"""Tokenizer.min_tokens is a true lower bound: a prompt it refuses could never have fit."""

import random

import pytest


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model.tokenizer


def _texts():
    rng = random.Random(0)
    yield "#" * 5000  # the longest tokens of the default vocabulary are runs like this
    yield "\n" + " " * 4000
    yield "=" * 3000 + "#" * 3000
    yield "lorem ipsum dolor sit amet " * 400
    yield "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(3000))  # mixed scripts
    yield "".join(rng.choice(["<|im_start|>", "<|im_end|>", " the", "\n"]) for _ in range(800))


@pytest.mark.parametrize("text", list(_texts()), ids=range(6))
def test_min_tokens_never_exceeds_the_real_count(tokenizer, text):
    bound = tokenizer.min_tokens(text)
    assert 0 < bound <= len(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("text", [t for t in _texts() if len(t) > 4096])
def test_long_texts_encode_as_short_ones_do(tokenizer, text):
    """Long texts go through encode_batch (which releases the GIL): the same ids."""
    assert tokenizer.encode(text, add_special_tokens=False) == (
        tokenizer.backend.encode(text, add_special_tokens=False).ids
    )
