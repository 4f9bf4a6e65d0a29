"""The step loop: plan N+1, launch, collect N, update, deliver to per-request mailboxes.

The loop never awaits a client: it adds the text to each request's Delta and leaves it in a
Mailbox, which merges deltas while its reader lags (one pending slot, never an unbounded
queue). Scheduler calls run only on the event-loop thread, so no locks. Hot path: keep it
lean, put features in helpers.
"""

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from time import perf_counter

import anyio
import anyio.to_thread

from vtllm.engine.shadow_check import ShadowCheck
from vtllm.engine.speculative_text import push_run
from vtllm.engine.structured import Constraints
from vtllm.engine.text import TextStream
from vtllm.errors import VtllmError
from vtllm.scheduler.output import ERROR, STOP, Delta
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams

log = logging.getLogger("vtllm.engine")


class EngineDeadError(VtllmError):
    status = 503
    type = "service_unavailable"
    code = "engine_dead"


class Mailbox:
    """Where the loop leaves deltas for one reader: one merging slot per key (a request,
    or each choice of a request), one wake-up for all of them. Never an unbounded queue."""

    def __init__(self):
        self._pending: dict[object, Delta] = {}
        self._ready = anyio.Event()

    def put(self, key, delta: Delta) -> None:
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = delta
        else:
            pending.merge(delta)
        self._ready.set()

    def poke(self) -> None:
        """Wakes the reader with nothing: its get_all returns an empty dict."""
        self._ready.set()

    async def get_all(self) -> dict[object, Delta]:
        await self._ready.wait()
        deltas, self._pending = self._pending, {}
        self._ready = anyio.Event()
        return deltas


class Collector(Mailbox):
    """A mailbox for a single request."""

    async def get(self) -> Delta:
        return (await self.get_all())[None]


@dataclass(slots=True)
class Tracked:
    request: Request
    mailbox: Mailbox
    key: object
    text: TextStream
    added_at: float  # perf_counter at add(); the observer measures latencies from it
    scheduled_at: float = 0.0  # first admission to a step (0: still queued)
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    disconnected_at: float = 0.0  # when the server saw the client go (0: it did not)


class StepLoop:
    def __init__(
        self,
        scheduler,
        backend,
        tokenizer,
        *,
        async_depth: int,
        shadow_rate=0.0,
        observer=None,
        vocab_size: int | None = None,
    ):
        self.scheduler = scheduler
        self.backend = backend
        self.tokenizer = tokenizer
        # token masks of constrained requests span the logits (vocab_size: the model's width)
        self.constraints = Constraints(tokenizer, vocab_size or tokenizer.vocab_size)
        self.depth = async_depth
        self.tracked: dict[str, Tracked] = {}
        self._ids = itertools.count()
        self._wake = anyio.Event()
        self.stopping = False
        self.num_steps = 0  # launched
        self._num_collected = 0
        # plans launched before their token masks could be known: (plan, its constrained
        # requests, the steps launched before it), oldest first (see _fill_masks)
        self._late_masks: deque = deque()
        self.num_finished = 0
        self.created_at = perf_counter()  # the clock the seconds below are parts of
        self.host_seconds = 0.0  # scheduling and bookkeeping on the event-loop thread
        # awaiting a launched step's results (the device's time the host did not cover with
        # its own work: near zero while the device waits on the host instead), and waiting for
        # a request; time_split adds the spell in progress
        self._wait_seconds = self._idle_seconds = 0.0
        self._wait_since: float | None = None
        self._idle_since: float | None = None
        self.shadow = ShadowCheck(backend, shadow_rate)
        # on_added(tracked), on_scheduled(tracked, now), on_tokens(tracked, n, now),
        # on_finish(tracked, delta, now)
        self.observer = observer
        self.num_added = 0  # each ends once: num_added == num_finished + len(tracked)
        self._queued: dict[str, Tracked] = {}  # never scheduled yet (for the queue-time metric)
        # The watchdog reads these from its thread: `stepping` while there is work, and the
        # perf_counter of the last sign of progress (a step collected, or work arriving).
        self.stepping = False
        self.progress_at = 0.0
        self.dead: str | None = None  # why the engine died; it never steps again
        # Serving sets this: a failed step then kills the engine instead of raising out of
        # run(); it is called once with the reason, on the event-loop thread.
        self.on_dead = None

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    # -- called by request handlers (same thread) -------------------------------------------
    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        seed: int | None = None,
        priority: int = 0,
        mailbox: Mailbox | None = None,
        key=None,
    ) -> Mailbox:
        """Queue a request; raises a user error (nothing kept) if it can never run. Its deltas
        go to `mailbox` under `key` (a new Collector by default). The scheduler's Request is
        built here: callers hand over its fields, never its state."""
        if self.dead is not None:
            raise EngineDeadError("the engine has failed; the server is restarting")
        request = Request(request_id, list(prompt_ids), params, seed=seed, priority=priority)
        request.constraint = self.constraints.build(params)
        self.scheduler.add_request(request)
        mailbox = Collector() if mailbox is None else mailbox
        text = TextStream(self.tokenizer, request.prompt_token_ids, request.sampling)
        tracked = Tracked(request, mailbox, key, text, perf_counter())
        self.tracked[request.request_id] = self._queued[request.request_id] = tracked
        self.num_added += 1
        if self.observer is not None:
            self.observer.on_added(tracked)
        self._wake.set()
        return mailbox

    def abort(self, request_id: str, disconnected_at: float = 0.0) -> None:
        """End a request now (its blocks are freed before this returns). `disconnected_at`:
        the perf_counter at which the server saw its client go, for the metrics."""
        tracked = self.tracked.get(request_id)
        if tracked is not None:
            tracked.disconnected_at = disconnected_at
        delta = self.scheduler.abort_request(request_id)
        if delta is not None:
            self._deliver([delta])
        self._wake.set()

    def stop(self) -> None:
        self.stopping = True
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------
    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Steps until stop() is called and no work is left."""
        task_status.started()
        scheduler, backend = self.scheduler, self.backend
        in_flight: deque = deque()
        try:
            while True:
                if len(in_flight) < self.depth and scheduler.requests:
                    if not self.stepping:
                        self.stepping, self.progress_at = True, perf_counter()
                    started = perf_counter()
                    plan = scheduler.schedule()
                    if plan is not None:
                        if scheduler.constrained:
                            self.host_seconds += perf_counter() - started
                            if not await self._fill_masks(plan, in_flight):
                                return
                            started = perf_counter()
                        if plan.seated and self._queued:
                            self._note_scheduled()
                        self.shadow.before_launch()
                        in_flight.append(backend.launch(plan))
                        self.shadow.launched(plan, self.tracked)
                        self.num_steps += 1
                    self.host_seconds += perf_counter() - started
                    if plan is not None and len(in_flight) < self.depth:
                        continue
                if in_flight:
                    if not await self._collect(in_flight.popleft()):
                        return
                    continue
                if self.stopping and not scheduler.has_work():
                    return
                self.stepping = False
                self._idle_since = perf_counter()
                await self._wake.wait()
                self._idle_seconds += perf_counter() - self._idle_since
                self._idle_since = None
                self._wake = anyio.Event()
        except Exception as exc:
            # first: a step waiting for its masks holds the backend's worker, which a dying
            # engine's callback may shut down
            self._release_late_masks()
            if self.on_dead is None:  # offline use (LLM, warm-up): the caller sees the error
                self.fail_all("the engine stopped while serving this request")
                raise
            # Serving: the device state after a failed step is unknown, so fail everything,
            # die, and let the supervisor restart the process (as vLLM does).
            log.exception("engine step failed")
            self.die(f"an engine step failed ({exc.__class__.__name__})")
        except BaseException:
            self.fail_all("the engine stopped while serving this request")
            raise
        finally:
            self._release_late_masks()

    async def _collect(self, step) -> bool:
        """Wait for a launched step and hand its tokens on; False once the engine is dead."""
        self._wait_since = perf_counter()
        # abandon_on_cancel: a hung step must not hold up the shutdown after the watchdog
        # declared the engine dead.
        result = await anyio.to_thread.run_sync(self.backend.collect, step, abandon_on_cancel=True)
        self._wait_seconds += perf_counter() - self._wait_since
        self._wait_since = None
        if self.dead is not None:
            return False
        started = self.progress_at = perf_counter()
        self._num_collected += 1
        self._deliver(self.scheduler.update(result))
        self.shadow.after_update()
        while self._late_masks and self._late_masks[0][2] <= self._num_collected:
            plan, constrained, _ = self._late_masks.popleft()
            self._write_masks(plan, constrained)
            self.backend.send_masks(plan)
        self.host_seconds += perf_counter() - started
        return True

    async def _fill_masks(self, plan, in_flight: deque) -> bool:
        """Token masks of the plan's constrained requests, before it is launched. A mask
        follows from every earlier token, so a request whose last token is still in flight
        must wait for it. A backend that samples where it runs the forward (the CPU:
        `defer_masks`) takes the plan at once and waits for its masks only before sampling:
        they are written as soon as the steps before it are collected (_collect), while its
        forward runs. Other backends (CUDA: the sampler is inside the step's graph) collect
        the steps in flight first, and the plan runs at depth 1. Either way a mask sees the
        tokens depth 1 would, so the depth-2 law holds. A request's first token (its prompt
        is known) needs no wait. False once dead."""
        constrained = list(self.scheduler.constrained)
        # one placeholder is this plan's own sample; more means an earlier one is in flight
        if in_flight and any(r.num_placeholders > 1 for r in constrained):
            defer = getattr(self.backend, "defer_masks", None)
            if defer is not None:
                defer(plan)
                self._late_masks.append((plan, constrained, self.num_steps))
                return True
            while in_flight:
                if not await self._collect(in_flight.popleft()):
                    return False
        self._write_masks(plan, constrained)
        return True

    def _write_masks(self, plan, constrained) -> None:
        started = perf_counter()
        plan.token_masks = {
            r.slot: r.constraint.next_mask() for r in constrained if not r.is_finished
        }
        self.host_seconds += perf_counter() - started

    def _release_late_masks(self) -> None:
        """The loop is ending: a step waiting for its masks runs without them (its tokens are
        never delivered), so the backend's worker is never left waiting."""
        while self._late_masks:
            plan = self._late_masks.popleft()[0]
            plan.token_masks = {}
            self.backend.send_masks(plan)

    def time_split(self, now: float) -> tuple[float, float, float]:
        """(host, wait, idle) seconds up to perf_counter() reading `now`, a wait or idle spell
        in progress included, so two readings bound what happened between them (each spell
        is counted in the reading that sees it)."""
        wait, idle = self._wait_seconds, self._idle_seconds
        if self._wait_since is not None:
            wait += max(now - self._wait_since, 0.0)
        if self._idle_since is not None:
            idle += max(now - self._idle_since, 0.0)
        return self.host_seconds, wait, idle

    def die(self, reason: str) -> None:
        """Mark the engine dead: every request it holds fails, nothing steps again."""
        if self.dead is not None:
            return
        self.dead, self.stepping = reason, False
        self.fail_all(f"the engine failed: {reason}")
        if self.on_dead is not None:
            self.on_dead(reason)
        self._wake.set()

    def fail_all(self, message: str) -> None:
        for request_id in list(self.tracked):
            delta = self.scheduler.finish_request(request_id, ERROR, message)
            if delta is not None:
                self._deliver([delta])

    def _note_scheduled(self) -> None:
        now = perf_counter()
        for request_id, tracked in list(self._queued.items()):
            if tracked.request.admitted:
                del self._queued[request_id]
                tracked.scheduled_at = now
                if self.observer is not None:
                    self.observer.on_scheduled(tracked, now)

    def _deliver(self, deltas: list[Delta]) -> None:
        for delta in deltas:
            tracked = self.tracked.get(delta.request_id)
            if tracked is None:
                continue
            ids = delta.token_ids
            # A stop or eos token counts as output but is not rendered as text.
            visible = (
                ids[:-1]
                if delta.finish_reason == STOP
                and ids
                and isinstance(delta.stop_reason, int | None)
                and ids[-1] in tracked.request.stop_ids
                else ids
            )
            if len(ids) > 1 and tracked.text.stops:  # a speculative run: token by token
                delta.text = push_run(tracked.text, delta, visible)
            else:
                delta.text = tracked.text.push(visible, final=delta.finished)
            stop = tracked.text.stopped_by
            if stop is not None and not delta.finished:
                final = self.scheduler.finish_request(
                    delta.request_id, STOP, stop, delta.num_output_tokens
                )
                delta.finished, delta.finish_reason, delta.stop_reason = True, STOP, stop
                if final is not None:
                    delta.num_output_tokens = final.num_output_tokens
                    delta.text += tracked.text.push([], final=True)
            if ids and tracked.first_token_at == 0.0:
                tracked.first_token_at = perf_counter()
            if self.observer is not None:
                now = perf_counter()
                if ids:
                    self.observer.on_tokens(tracked, len(ids), now)
                    tracked.last_token_at = now
                if delta.finished:
                    self.observer.on_finish(tracked, delta, now)
            if delta.finished:
                del self.tracked[delta.request_id]
                self._queued.pop(delta.request_id, None)
                self.num_finished += 1
            tracked.mailbox.put(tracked.key, delta)
