"""Per-slot sampling settings as plain arrays, and the sampler's logprobs output.

Backend-neutral on purpose: the CPU sampler, a CUDA sampler (which would mirror these arrays on
the device) and the numpy reference all read the same table. Values are primitives, never a
SamplingParams (the kernels package imports nothing else of vtllm)."""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MAX_LOGIT_BIAS = 300  # the OpenAI API's cap
MAX_MIN_STOP_IDS = 65  # 64 user stop ids + eos
MAX_TOP_LOGPROBS = 20
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: smaller temperatures are greedy (1/T would overflow)
EXP_CUTOFF = -700.0  # scaled logits this far below the max (or further) get probability 0

# field -> (dtype, row width; 0 = one value per slot), in declaration order
TABLE_LAYOUT = {
    "temperature": (np.float32, 0),
    "top_k": (np.int32, 0),
    "top_p": (np.float32, 0),
    "min_p": (np.float32, 0),
    "seed": (np.uint64, 0),
    "presence_penalty": (np.float32, 0),
    "frequency_penalty": (np.float32, 0),
    "repetition_penalty": (np.float32, 0),
    "min_tokens": (np.int32, 0),
    "num_logprobs": (np.int32, 0),
    "prompt_len": (np.int32, 0),
    "bias_ids": (np.int32, MAX_LOGIT_BIAS),
    "bias_values": (np.float32, MAX_LOGIT_BIAS),
    "num_bias": (np.int32, 0),
    "min_stop_ids": (np.int32, MAX_MIN_STOP_IDS),
    "num_min_stop_ids": (np.int32, 0),
}


@dataclass(slots=True)
class SamplingTable:
    """Written when a request takes a slot, read by the sampler every step."""

    temperature: np.ndarray  # [max_slots] float32; < GREEDY_EPS = greedy
    top_k: np.ndarray  # [max_slots] int32; 0 = off
    top_p: np.ndarray  # [max_slots] float32; 1 = off
    min_p: np.ndarray  # [max_slots] float32; 0 = off
    seed: np.ndarray  # [max_slots] uint64
    presence_penalty: np.ndarray  # [max_slots] float32
    frequency_penalty: np.ndarray  # [max_slots] float32
    repetition_penalty: np.ndarray  # [max_slots] float32; 1 = off
    min_tokens: np.ndarray  # [max_slots] int32
    num_logprobs: np.ndarray  # [max_slots] int32; -1 = none
    prompt_len: np.ndarray  # [max_slots] int32
    bias_ids: np.ndarray  # [max_slots, MAX_LOGIT_BIAS] int32
    bias_values: np.ndarray  # [max_slots, MAX_LOGIT_BIAS] float32
    num_bias: np.ndarray  # [max_slots] int32
    min_stop_ids: np.ndarray  # [max_slots, MAX_MIN_STOP_IDS] int32; -inf until min_tokens
    num_min_stop_ids: np.ndarray  # [max_slots] int32

    @classmethod
    def create(cls, max_slots: int) -> "SamplingTable":
        table = cls(
            **{
                name: np.zeros((max_slots, width) if width else max_slots, dtype)
                for name, (dtype, width) in TABLE_LAYOUT.items()
            }
        )
        for slot in range(max_slots):
            table.clear_slot(slot)
        return table

    def set_slot(
        self,
        slot: int,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        seed: int,
        presence_penalty: float,
        frequency_penalty: float,
        repetition_penalty: float,
        min_tokens: int,
        num_logprobs: int | None,
        prompt_len: int,
        logit_bias: dict[int, float] | None,
        min_stop_ids: list[int],
    ) -> None:
        bias = logit_bias or {}
        min_stop_ids = list(dict.fromkeys(min_stop_ids))  # eos may repeat a user stop id
        if len(bias) > MAX_LOGIT_BIAS or len(min_stop_ids) > MAX_MIN_STOP_IDS:
            raise ValueError("too many logit_bias entries or min-token stop ids")
        self.temperature[slot], self.top_k[slot] = temperature, max(top_k, 0)
        self.top_p[slot], self.min_p[slot] = top_p, min_p
        self.seed[slot] = seed & 0xFFFFFFFFFFFFFFFF  # negative seeds wrap, as in C
        self.presence_penalty[slot] = presence_penalty
        self.frequency_penalty[slot] = frequency_penalty
        self.repetition_penalty[slot] = repetition_penalty
        self.min_tokens[slot], self.prompt_len[slot] = min_tokens, prompt_len
        none = num_logprobs is None or num_logprobs < 0
        self.num_logprobs[slot] = -1 if none else min(num_logprobs, MAX_TOP_LOGPROBS)
        self.num_bias[slot] = len(bias)
        self.bias_ids[slot, : len(bias)] = list(bias.keys())
        self.bias_values[slot, : len(bias)] = list(bias.values())
        self.num_min_stop_ids[slot] = len(min_stop_ids)
        self.min_stop_ids[slot, : len(min_stop_ids)] = min_stop_ids

    def clear_slot(self, slot: int) -> None:
        """Neutral settings: temperature 1, no filters, penalties or logprobs."""
        self.set_slot(
            slot,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            seed=0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            min_tokens=0,
            num_logprobs=None,
            prompt_len=0,
            logit_bias=None,
            min_stop_ids=[],
        )

    def arrays(self) -> tuple:
        """The fields as one tuple in declaration order: kernels take it as one argument."""
        return tuple(getattr(self, name) for name in TABLE_LAYOUT)


class LogprobsOut(NamedTuple):
    """Raw-distribution logprobs of sampled tokens. Columns past a row's num_logprobs hold
    -1 / -inf; rows whose slot has num_logprobs < 0 (and padding rows) are left untouched."""

    logprob: np.ndarray  # [B] float32
    rank: np.ndarray  # [B] int32; 1 = most likely
    top_ids: np.ndarray  # [B, MAX_TOP_LOGPROBS] int32
    top_logprobs: np.ndarray  # [B, MAX_TOP_LOGPROBS] float32

    @classmethod
    def create(cls, batch: int) -> "LogprobsOut":
        shape = (batch, MAX_TOP_LOGPROBS)
        return cls(
            np.zeros(batch, np.float32),
            np.zeros(batch, np.int32),
            np.zeros(shape, np.int32),
            np.zeros(shape, np.float32),
        )
