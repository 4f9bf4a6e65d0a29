"""Speculative chunks on the CUDA runner: the drafts' field of the step's metadata, the
verification rounds on the stream, and what the host reads of them one step late.

The CPU verifies on the host (executor/speculative.verify_drafts); here the draws never reach
the host before the step is collected, so the same rule runs on the device: round 0 is the
step's ordinary draw, and round j (1..d) samples row j of each chunk whose draw of round j - 1
equalled its draft j - 1 (kernels/cuda/speculative.next_round), with the runner's own sampler
at position first + j: the same logits bits as a one-token step (batch-invariant kernels), the
same mirror history (the drafts were written there before the forward, and each draw writes
its token where the draft sat), the same uniform. A row that is not drawn yields -1, so the
host learns how many tokens a chunk emitted from the round tokens it copies back with the
step's first draws, in the same queued copies: no extra synchronisation.

With CUDA graphs on, a step with drafts replays a graph of k rounds (executor/cuda_graph_steps);
one that fits none runs eagerly, with as many rounds as its longest draft run.
"""

import numpy as np
from numba import cuda

from vtllm.executor.speculative import roll_back_blocks, token_logprobs
from vtllm.kernels import cuda as ops
from vtllm.kernels.cuda.gather import gather_rows
from vtllm.kernels.cuda.speculative import next_round, write_drafts


def first_positions(chunks) -> list[int]:
    """The position each sampling chunk's first draw takes (its drafts' first position)."""
    return [c.start + c.num_tokens - len(c.draft_token_ids) for c in chunks]


class SpeculativeRounds:
    """Device and pinned buffers of the rounds after the first: made for k rounds at start
    when graphs capture them (nothing may allocate in a capture), else grown to the largest
    draft count an eager step brings."""

    def __init__(self, max_num_seqs: int, ring: int, stream, rounds: int = 0):
        self.S, self.ring, self.stream = max_num_seqs, ring, stream
        self.rounds = 0
        self.meta_dev = cuda.device_array((3, max_num_seqs), np.int32, stream=stream)
        if rounds:
            self._grow(rounds)

    def _grow(self, rounds: int) -> None:
        S, s = self.S, self.stream
        self.tokens_dev = cuda.device_array((rounds, S), np.int32, stream=s)
        self.tokens_host = [cuda.pinned_array((rounds, S), np.int32) for _ in range(self.ring)]
        self.logprobs_dev = ops.LogprobsOut.create(rounds * S, stream=s)
        self.logprobs_host = [
            ops.LogprobsOut(*(cuda.pinned_array(a.shape, a.dtype) for a in self.logprobs_dev))
            for _ in range(self.ring)
        ]
        self.rounds = rounds

    @staticmethod
    def write_drafts(mirror, views: dict, stream) -> None:
        """The staged drafts into the mirror: before the forward gathers its input ids."""
        write_drafts(
            mirror, views["token_slots"], views["positions"], views["token_drafts"], stream=stream
        )

    def enqueue(self, runner, logits, views: dict, B: int, rounds: int) -> None:
        """Enqueues rounds 1..rounds after the first draw (runner.out_tokens_dev[:B]) over the
        step's logits [R, V]: device work only, which a graph may capture."""
        if rounds > self.rounds:
            self._grow(rounds)
        s = self.stream
        slots, positions, rows = (self.meta_dev[i, :B] for i in range(3))
        picked = runner.sample_logits[:B]
        prev = runner.out_tokens_dev[:B]
        for j in range(1, rounds + 1):
            next_round(
                j,
                views["token_drafts"],
                views["logits_rows"],
                views["sample_rows"],
                views["sample_slots"],
                views["sample_positions"],
                prev,
                slots,
                positions,
                rows,
                stream=s,
            )
            gather_rows(logits, rows, picked, stream=s)
            out = self.tokens_dev[j - 1, :B]
            at = (j - 1) * self.S
            lp = ops.LogprobsOut(*(a[at : at + B] for a in self.logprobs_dev))
            ops.sample(
                picked,
                slots,
                positions,
                runner.sampling_dev,
                runner.token_ids_dev,
                runner.num_tokens_dev,
                out,
                out_logprobs=lp,
                scratch=runner.sampler_scratch,
                stream=s,
            )
            prev = out

    def copy_back(self, runner, chunks, num_logprobs, ring: int, rounds: int) -> tuple:
        """Queues the copies of the rounds' tokens (and logprobs, when a chunk wants them) to
        ring's pinned buffers. Returns what collect() takes (InFlight.spec): the chunks, their
        logprobs wanted, and their slots' seat counts at launch."""
        s = self.stream
        self.tokens_dev[:rounds].copy_to_host(self.tokens_host[ring][:rounds], stream=s)
        if any(k >= 0 for k in num_logprobs):
            n = rounds * self.S
            for dev, host in zip(self.logprobs_dev, self.logprobs_host[ring], strict=True):
                dev[:n].copy_to_host(host[:n], stream=s)
        return chunks, num_logprobs, runner.slot_seats[[c.slot for c in chunks]]

    def collect(self, runner, ring: int, spec: tuple) -> list:
        """StepOutput.more of a collected speculative step (its InFlight.spec), with the
        block tables rolled back."""
        chunks, num_logprobs, seats = spec
        more = self.more(ring, chunks, num_logprobs)
        roll_back(runner, chunks, more, seats)
        return more

    def more(self, ring: int, chunks, num_logprobs) -> list:
        """Per sampling chunk: None, or (its tokens after the first, their logprobs) from the
        round tokens in ring's buffers (a round that did not draw a chunk's row left -1)."""
        tokens = self.tokens_host[ring]
        lp = self.logprobs_host[ring]
        out = [None] * len(chunks)
        for b, c in enumerate(chunks):
            if not c.draft_token_ids:
                continue
            ids, lps = [], []
            for j in range(1, len(c.draft_token_ids) + 1):
                token = int(tokens[j - 1, b])
                if token < 0:
                    break
                ids.append(token)
                if num_logprobs[b] >= 0:
                    lps.append(token_logprobs(token, lp, (j - 1) * self.S + b, num_logprobs[b]))
            out[b] = (ids, lps)
        return out


def roll_back(runner, chunks, more, seats_at_launch: list[int]) -> None:
    """The block tables of speculative chunks rolled back as the scheduler rolls its blocks
    back, once the host knows how many drafts were kept. Unlike the CPU, this happens after
    later plans were applied (depth 2): a slot seated again since the launch (its seat count
    moved) belongs to someone else now and is left alone. A slot only freed may be rolled
    back: its table is unused until a seat rewrites it."""
    kept = [
        m if m is not None and runner.slot_seats[c.slot] == seats_at_launch[b] else None
        for b, (c, m) in enumerate(zip(chunks, more, strict=True))
    ]
    roll_back_blocks(runner, chunks, np.asarray(first_positions(chunks), np.int32), kept)
