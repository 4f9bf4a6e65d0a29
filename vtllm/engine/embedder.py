"""Sentence embeddings from an encoder checkpoint (models/bert): tokenize, run, pool.

An encoder computes a request in one forward with no cache, so it needs none of the step
loop's machinery: a request's inputs run as one batch in a worker thread, one request at a time
(the kernels use every core already). The CPU backend runs it; a GPU encoder is not built yet.
"""

import threading
from pathlib import Path

import numpy as np

from vtllm.errors import ContextLengthExceeded, InvalidParameter, UnsupportedModel
from vtllm.executor.cpu_encoder_ops import CpuEncoderOps
from vtllm.models import bert
from vtllm.models.tokenizer import from_tokenizer_json

MAX_INPUTS = 2048  # inputs per request, as OpenAI caps them


class Embedder:
    def __init__(self, path: Path, *, device: str = "cpu"):
        if device != "cpu":
            raise UnsupportedModel(
                f"{path}: encoder (embedding) models run on the cpu device only for now"
            )
        self.path = path
        self.name = path.name
        self.config = bert.read_config(path)
        self.model = bert.BertModel(
            self.config, bert.load_weights(path, self.config), CpuEncoderOps()
        )
        self.tokenizer = from_tokenizer_json(path)
        backend = self.tokenizer.backend
        backend.no_padding()  # the checkpoint's file pads to a fixed length; a forward needs none
        backend.no_truncation()  # over-long inputs are refused (or cut by truncate_prompt_tokens)
        self.max_model_len = self.config.max_seq_length
        self.dimensions = self.config.hidden_size
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        """Token ids with the model's special tokens ([CLS] ... [SEP] for BERT)."""
        return self.tokenizer.backend.encode(text).ids

    def check(self, sequences: list[list[int]], truncate: int | None = None) -> list[list[int]]:
        """The sequences as the model takes them: non-empty, within max_model_len (the last
        `truncate` tokens of longer ones when asked, vLLM's truncate_prompt_tokens)."""
        if not sequences:
            raise InvalidParameter("input must not be empty", param="input")
        if len(sequences) > MAX_INPUTS:
            raise InvalidParameter(f"at most {MAX_INPUTS} inputs per request", param="input")
        vocab, out = self.config.vocab_size, []
        for i, ids in enumerate(sequences):
            if truncate is not None and len(ids) > truncate:
                ids = ids[-truncate:]
            if not ids:
                raise InvalidParameter(f"input[{i}] is empty", param="input")
            if len(ids) > self.max_model_len:
                raise ContextLengthExceeded(
                    f"input[{i}] has {len(ids)} tokens; this model takes at most "
                    f"{self.max_model_len} (or pass truncate_prompt_tokens)",
                    param="input",
                )
            if min(ids) < 0 or max(ids) >= vocab:
                raise InvalidParameter(
                    f"input[{i}]: token ids must be in [0, {vocab})", param="input"
                )
            out.append(list(ids))
        return out

    def embed(self, sequences: list[list[int]]) -> np.ndarray:
        """[len(sequences), dimensions] float32 (checked sequences; blocking)."""
        with self._lock:
            return self.model.forward(sequences)
