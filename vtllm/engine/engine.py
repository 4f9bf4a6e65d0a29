"""The engine's seam: submit prompts, read back a Stream of Deltas, abort.

The HTTP server and the offline LLM drive the engine through this module: they hand over
prompt ids and SamplingParams (never a scheduler Request) and read the scheduler's Delta, the
one output type, with the text the step loop added to it. A chat request's output goes
scheduler.update -> StepLoop._deliver (text, stop strings) -> Mailbox -> Stream -> the shaper.
"""

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio

from vtllm.config import EngineConfig
from vtllm.engine.build import build_parts
from vtllm.engine.faults import BlockHog, FaultyBackend
from vtllm.engine.loop import Mailbox, StepLoop
from vtllm.scheduler.output import Delta
from vtllm.scheduler.sampling_params import SamplingParams

log = logging.getLogger("vtllm.engine")


@dataclass(slots=True)
class Choice:
    """One sample of one prompt: its request in the engine and its output so far."""

    index: int  # in its stream, as OpenAI numbers choices
    request_id: str
    prompt_ids: list[int]
    first_of_prompt: bool  # the first of its prompt's n samples: usage counts a prompt once
    total: Delta  # every delta read so far, merged


class Stream:
    """The choices of one submission (each prompt times n samples), read from one mailbox:
    a reader that lags gets each choice's missed deltas merged into one, never a queue."""

    def __init__(self, engine: "Engine", stream_id: str):
        self.engine = engine
        self.id = stream_id
        self.created = int(time.time())  # the unix second OpenAI's `created` reports
        self.choices: list[Choice] = []
        self.mailbox = Mailbox()

    @property
    def finished(self) -> bool:
        return all(c.total.finished for c in self.choices)

    def abort(self, disconnected_at: float = 0.0) -> None:
        """Ends every unfinished choice now; `disconnected_at`: the perf_counter at which the
        client was seen to go, for the metrics."""
        for choice in self.choices:
            if not choice.total.finished:
                self.engine.abort(choice.request_id, disconnected_at)

    def poke(self) -> None:
        """Wakes the reader with nothing: it gets (None, None) (an SSE keep-alive)."""
        self.mailbox.poke()

    async def __aiter__(self):
        """(choice, delta) until every choice has finished, each delta already merged into
        its choice's total; (None, None) when poked."""
        while not self.finished:
            deltas = await self.mailbox.get_all()
            if not deltas:
                yield None, None
                continue
            for index, delta in deltas.items():
                choice = self.choices[index]
                choice.total.merge(delta)
                yield choice, delta


class Engine:
    """The step loop and what it composes (scheduler, backend, model), behind submit/abort.
    Its methods run on the event-loop thread, as the scheduler's do: no locks."""

    def __init__(self, loop: StepLoop, loaded, max_model_len: int, faults=None, embedder=None):
        self.loop = loop
        self.embedder = embedder  # engine/embedder.Embedder with --embedding-model, else None
        self.scheduler, self.backend = loop.scheduler, loop.backend
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.max_model_len = max_model_len
        self.faults = faults  # (FaultyBackend, BlockHog) with VT_DEBUG_FAULTS

    @classmethod
    def build(cls, config: EngineConfig, loaded=None, *, phases: dict | None = None) -> "Engine":
        """Loads the model (unless `loaded` is given), sizes the KV cache and wires the parts;
        `phases` gets the seconds of each start-up phase."""
        loaded, scheduler, backend, max_model_len = build_parts(config, loaded, phases=phases)
        faults = None
        if config.debug_faults:
            log.warning("fault injection is on (VT_DEBUG_FAULTS): POST /debug/fault")
            backend = FaultyBackend(backend)
            faults = (backend, BlockHog(scheduler.pool))
        loop = StepLoop(
            scheduler,
            backend,
            loaded.tokenizer,
            async_depth=config.async_depth,
            shadow_rate=config.shadow_check_rate,
            vocab_size=loaded.config.vocab_size,
        )
        embedder = None
        if config.embedding_model:
            from vtllm.engine.embedder import Embedder

            embedder = Embedder(Path(config.embedding_model).expanduser(), device=config.device)
        return cls(loop, loaded, max_model_len, faults, embedder)

    # -- requests ----------------------------------------------------------------------------
    def submit(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        priority: int = 0,
        prefix: str = "req",
    ) -> Stream:
        """Queues params.n choices of each prompt (sample k seeded seed + k), all or none: a
        request that can never run raises a user error before anything streams, and the
        choices already queued are aborted. `priority` orders the queue (lower first)."""
        stream = Stream(self, f"{prefix}-{uuid.uuid4().hex}")
        try:
            for p, ids in enumerate(prompts):
                for k in range(params.n):
                    # "-0" ends a prompt's first choice (vllm_metrics counts n once by it)
                    request_id, index = f"{stream.id}-{p}-{k}", len(stream.choices)
                    self.loop.add(
                        request_id,
                        ids,
                        params,
                        seed=None if params.seed is None else params.seed + k,
                        priority=priority,
                        mailbox=stream.mailbox,
                        key=index,
                    )
                    total = Delta(request_id=request_id)
                    stream.choices.append(Choice(index, request_id, ids, k == 0, total))
        except BaseException:
            stream.abort()
            raise
        return stream

    def abort(self, request_id: str, disconnected_at: float = 0.0) -> None:
        self.loop.abort(request_id, disconnected_at)

    # -- the task tree -----------------------------------------------------------------------
    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Steps until stop() is called and no work is left; it may run again afterwards."""
        try:
            await self.loop.run(task_status=task_status)
        finally:
            self.loop.stopping = False

    def stop(self) -> None:
        self.loop.stop()

    def die(self, reason: str) -> None:
        """Fails every request and never steps again (the watchdog's and a failed step's end)."""
        self.loop.die(reason)

    def fail_all(self, message: str) -> None:
        """Ends every request with finish_reason "error" (a drain that ran out of time)."""
        self.loop.fail_all(message)

    @property
    def dead(self) -> str | None:
        """Why the engine died (None while alive)."""
        return self.loop.dead

    @property
    def on_dead(self):
        return self.loop.on_dead

    @on_dead.setter
    def on_dead(self, callback) -> None:
        """Serving: a failed step then kills the engine (callback(reason) on the event-loop
        thread) instead of raising out of run()."""
        self.loop.on_dead = callback

    @property
    def observer(self):
        return self.loop.observer

    @observer.setter
    def observer(self, observer) -> None:
        self.loop.observer = observer

    # -- load, for admission and drain -------------------------------------------------------
    @property
    def num_unfinished(self) -> int:
        return len(self.loop.tracked)

    @property
    def num_finished(self) -> int:
        return self.loop.num_finished

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def num_waiting_prompt_tokens(self) -> int:
        """O(waiting): the prompts of the requests not yet scheduled."""
        return sum(r.num_prompt_tokens for r in self.scheduler.waiting)
