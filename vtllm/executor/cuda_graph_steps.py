"""Which steps of the CUDA runner replay a captured graph, and the capture: a mixin of
CudaModelRunner (executor/cuda_runner), apart so that the runner's hot path stays short, and
the host-side layout of the graphs (no kernel imports: tests/engine checks it on any machine).

A graph's key is a plain step's token bucket (step_layout.graph_buckets), or (b, k) for a step
with drafts: b sequences (a bucket of up to the largest batch that speculates, the scheduler's
disable_by_batch_size - 1), b * (k + 1) token and logits rows, b sampled chunks and k
verification rounds (k = num_speculative_tokens; executor/cuda_speculative). A chunk with
fewer than k drafts stops drawing at the round past its last draft (the token row after it
carries no draft), so the same k rounds serve every step. Every graph is captured at start
(CudaModelRunner.capture_all) after an eager warm-up run of the same launches; a step that
fits no graph (prompt logprobs, a long prefill chunk) runs eagerly.
"""

import numpy as np

from vtllm.executor.cuda_graphs import CudaGraph
from vtllm.executor.step_layout import graph_counts, pad_step


def spec_graph_buckets(buckets, max_num_seqs: int, max_tokens: int, k: int, max_batch: int):
    """The sequence buckets whose steps with drafts get a graph: the plain buckets of up to
    max_num_seqs, up to the first that holds max_batch sequences (the largest batch that
    speculates; 0: none does), while their b * (k + 1) token rows fit the step's buffers."""
    out = []
    for b in buckets if k and max_batch > 0 else ():
        if b > max_num_seqs or b * (k + 1) > max_tokens:
            break
        out.append(b)
        if b >= max_batch:
            break
    return out


def spec_graph_counts(b: int, k: int) -> tuple[int, int, int, int]:
    """(tokens, sequences, logits rows, sampled rows) of bucket b's graph for k drafts."""
    return b * (k + 1), b, b * (k + 1), b


def spec_bucket(spec_buckets, k: int, num_tokens: int, num_seqs: int) -> int:
    """The smallest speculative bucket holding a step's tokens and sequences, or 0 (eager)."""
    return next((b for b in spec_buckets if b >= num_seqs and b * (k + 1) >= num_tokens), 0)


def graph_rounds(key) -> int:
    """A graph's verification rounds: its key is a plain token bucket (0), or (sequence
    bucket, k) for steps with drafts."""
    return key[1] if isinstance(key, tuple) else 0


def graph_shape(key, max_num_seqs: int) -> tuple[int, int, int, int]:
    """(tokens, sequences, logits rows, sampled rows) of the graph of this key."""
    return spec_graph_counts(*key) if graph_rounds(key) else graph_counts(key, max_num_seqs)


def pad_graph_step(key, fields: dict, counts: tuple[int, int, int, int]) -> dict:
    """A step's metadata padded to the counts of the graph of this key."""
    return pad_spec_step(fields, counts) if graph_rounds(key) else pad_step(fields, *counts[:2])


def pad_spec_step(fields: dict, counts: tuple[int, int, int, int]) -> dict:
    """A step's metadata (CudaModelRunner._fields) padded to a speculative graph's counts, as
    step_layout.pad_step pads a plain one: padding tokens have slot -1 and no draft, padding
    sequences are empty, padding logits rows -1 (a zero row); padding samples have slot -1
    and row -1, so next_round never draws them."""
    tokens, seqs, rows, samples = counts
    have = [len(fields[f]) for f in ("token_slots", "seq_lens", "logits_rows", "sample_slots")]
    if any(n > most for n, most in zip(have, counts, strict=True)):
        raise ValueError(f"a step of {have} (tokens, sequences, rows, samples) exceeds {counts}")
    t, s, r, b = have

    def tail(name, value, n):
        return np.concatenate([np.asarray(fields[name], np.int32), np.full(n, value, np.int32)])

    out = dict(fields)
    for name, value in (("token_slots", -1), ("slot_mapping", -1), ("token_drafts", -1)):
        out[name] = tail(name, value, tokens - t)
    out["positions"] = tail("positions", 0, tokens - t)
    out["query_start_loc"] = tail("query_start_loc", t, seqs - s)
    out["seq_lens"] = tail("seq_lens", 0, seqs - s)
    tables = np.asarray(fields["block_tables"], np.int32)
    out["block_tables"] = np.concatenate([tables, np.zeros((seqs - s, tables.shape[1]), np.int32)])
    out["logits_rows"] = tail("logits_rows", -1, rows - r)
    for name, value in (("sample_rows", -1), ("sample_slots", -1), ("sample_masks", -1)):
        out[name] = tail(name, value, samples - b)
    out["sample_positions"] = tail("sample_positions", 0, samples - b)
    return out


class GraphedSteps:
    """Needs from the runner: use_graphs, buckets, spec_buckets, spec_tokens, graphs,
    max_num_seqs, stream, programmatic_graphs and _step (its launches)."""

    def _graph_key(self, flat, num_sampled: int, want_logits: bool, rounds: int):
        """The graph this step replays: its token bucket, or (sequence bucket, k) for a step
        with drafts (executor/cuda_speculative); None runs it eagerly (prompt logprobs, which
        want the logits on the host, or a step larger than every bucket)."""
        if not self.use_graphs or want_logits:
            return None
        n = len(flat.positions)
        if rounds:
            b = spec_bucket(self.spec_buckets, self.spec_tokens, n, len(flat.slots))
            return (b, self.spec_tokens) if b else None
        if len(flat.logits_rows) != num_sampled:
            return None
        return next((b for b in self.buckets if b >= n), None)

    def _graph(self, key, views: dict) -> CudaGraph:
        graph = self.graphs.get(key)
        if graph is None:
            # Eager once first: compiles every kernel and makes launcher placeholders, so the
            # capture records launches only. The metadata just staged pads the real step with
            # slot -1 rows, so this run computes the real step (KV writes, samples) and the
            # replay that follows computes it again, to the same values (a step with drafts
            # writes its drafts into the mirror again first, where the draws overwrote them).
            samples, rounds = graph_shape(key, self.max_num_seqs)[3], graph_rounds(key)
            self._step(views, samples, rounds, rounds > 0)
            self.stream.synchronize()
            graph = CudaGraph(
                self.stream,
                lambda: self._step(views, samples, rounds, rounds > 0),
                programmatic=self.programmatic_graphs,
            )
            self.graphs[key] = graph
        return graph

    @property
    def graph_keys(self) -> list:
        """Every graph capture_all makes: the plain buckets, then the speculative ones."""
        return self.buckets + [(b, self.spec_tokens) for b in self.spec_buckets]
