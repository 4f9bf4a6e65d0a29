"""Tokenizers built with the `tokenizers` library, from tokenizer.json or GGUF metadata."""

import json
from functools import cached_property
from pathlib import Path

from vtllm.errors import ModelLoadError

_GIL_FREE_CHARS = 4096  # longer texts are encoded without holding the GIL


class Tokenizer:
    def __init__(
        self,
        backend,
        *,
        bos_token_id,
        eos_token_ids,
        add_bos: bool,
        chat_template,
        append_ids=(),
        normalizer_keeps_length: bool = False,
    ):
        self.backend = backend  # tokenizers.Tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self.append_ids = list(append_ids)  # close an encoded text (BERT's [SEP], T5's EOS)
        self.chat_template = chat_template
        self.normalizer_keeps_length = normalizer_keeps_length
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if len(text) > _GIL_FREE_CHARS:
            # `tokenizers` holds the GIL through encode() (a long text takes a good part of a
            # second) but releases it in encode_batch(): a long prompt tokenized in a worker
            # thread then leaves the event loop running.
            ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        if (
            add_special_tokens
            and self.append_ids
            and ids[-len(self.append_ids) :] != self.append_ids
        ):
            ids = [*ids, *self.append_ids]
        return ids

    @cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token stands for (+1 for a decoder that drops a leading
        space); 0 when a normalizer could shrink the text first and no bound holds (one that
        only writes spaces as "▁" and prepends one keeps each token's share of the text)."""
        backend = self.backend
        if backend.normalizer is not None and not self.normalizer_keeps_length:
            return 0
        ids = range(backend.get_vocab_size(with_added_tokens=True))
        return 1 + max(len(backend.decode([i], skip_special_tokens=False).encode()) for i in ids)

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)), without tokenizing: each token covers at most
        max_token_bytes of it. Lets a prompt that cannot fit the context be refused before
        spending a core on tokenizing it."""
        longest = self.max_token_bytes
        return len(text.encode()) // longest if longest else 0

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    def special_token(self, token_id: int | None) -> str:
        return "" if token_id is None else self.token_text(token_id)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids that decode(skip_special_tokens=True) leaves out."""
        added = self.backend.get_added_tokens_decoder()
        return frozenset(i for i, token in added.items() if token.special)


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas that never split a UTF-8 character.

    Decodes a short window around the new ids (prefix_offset..end) and emits only what is new
    past read_offset, holding back output that ends in a replacement character, which means a
    multi-byte character is still incomplete. Ids that skip_special_tokens leaves out never
    enter the window: they render as nothing wherever they stand, and kept there they would
    grow it by one each (a model repeating its EOS under ignore_eos: quadratic time).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens=True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.skipped = tokenizer.special_ids if skip_special_tokens else frozenset()
        self.ids = [i for i in prompt_ids[-6:] if i not in self.skipped]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, new_ids) -> str:
        skipped = self.skipped
        new_ids = [i for i in new_ids if i not in skipped]
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        decode = self.tokenizer.decode
        prefix = decode(
            self.ids[self.prefix_offset : self.read_offset],
            skip_special_tokens=self.skip_special_tokens,
        )
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """At the end of the output: the text push held back, an unfinished character shown
        as U+FFFD as a whole decode of the ids renders it."""
        if self.read_offset == len(self.ids):
            return ""
        decode, skip = self.tokenizer.decode, self.skip_special_tokens
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""


def from_tokenizer_json(directory: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    path = directory / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{directory}: tokenizer.json is missing")
    try:
        backend = Backend.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot be read ({exc})") from None
    cfg = _read_json(directory / "tokenizer_config.json")
    gen = _read_json(directory / "generation_config.json")
    model_cfg = _read_json(directory / "config.json")

    def token_id(value):
        if isinstance(value, dict):
            value = value.get("content")
        return None if value is None else backend.token_to_id(value)

    bos = token_id(cfg.get("bos_token"))
    if bos is None:
        bos = gen.get("bos_token_id", model_cfg.get("bos_token_id"))
    eos = gen.get("eos_token_id", model_cfg.get("eos_token_id"))
    if eos is None:
        eos = token_id(cfg.get("eos_token"))
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    # tokenizer.json's post-processor adds BOS itself when the model wants one
    return Tokenizer(
        backend,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        add_bos=False,
        chat_template=cfg.get("chat_template"),
    )


def from_gguf(reader, path: Path, field) -> Tokenizer:
    from vtllm.models import gguf_vocab

    vocab = gguf_vocab.build(lambda key, default=None: field(reader, key, default), path)
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    return Tokenizer(
        vocab.backend,
        bos_token_id=vocab.bos_token_id,
        eos_token_ids=[] if eos is None else [int(eos)],
        add_bos=vocab.add_bos,
        chat_template=field(reader, "tokenizer.chat_template"),
        append_ids=vocab.append_ids,
        normalizer_keeps_length=vocab.normalizer_keeps_length,
    )


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: invalid JSON ({exc})") from None
