"""Submitting a request's choices to the step loop and reading them back.

All choices are added before anything is sent, so a request that can never run fails with a
4xx before any SSE byte; if one choice fails, the ones already added are aborted.
"""

import time
import uuid
from dataclasses import dataclass, field

from vtllm.engine.loop import Mailbox, StepLoop, Update
from vtllm.scheduler.sampling_params import SamplingParams


@dataclass(slots=True)
class Choice:
    index: int
    request_id: str
    prompt_ids: list[int]
    first_of_prompt: bool
    total: Update = field(default_factory=Update)


@dataclass(slots=True)
class Submission:
    id: str
    created: int
    choices: list[Choice]
    mailbox: Mailbox

    @property
    def finished(self) -> bool:
        return all(c.total.finished for c in self.choices)

    def abort_unfinished(self, loop: StepLoop, disconnected_at: float = 0.0) -> None:
        for choice in self.choices:
            if not choice.total.finished:
                loop.abort(choice.request_id, disconnected_at)

    async def updates(self):
        """Yields (choice, update) until every choice has finished; (None, None) when the
        mailbox was poked with nothing (the caller sends a keep-alive)."""
        while not self.finished:
            updates = await self.mailbox.get_all()
            if not updates:
                yield None, None
                continue
            for index, update in updates.items():
                choice = self.choices[index]
                choice.total.merge(update)
                yield choice, update


def submit(
    loop: StepLoop, prompts: list[list[int]], params: SamplingParams, prefix: str, priority: int = 0
):
    """Adds every choice; `priority` orders the queue and preemption (lower first)."""
    sub = Submission(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), [], Mailbox())
    try:
        for p, ids in enumerate(prompts):
            for k in range(params.n):
                seed = None if params.seed is None else params.seed + k
                request_id = f"{sub.id}-{p}-{k}"
                index = len(sub.choices)
                loop.add(
                    request_id,
                    ids,
                    params,
                    seed=seed,
                    priority=priority,
                    mailbox=sub.mailbox,
                    key=index,
                )
                sub.choices.append(Choice(index, request_id, ids, k == 0))
    except BaseException:
        sub.abort_unfinished(loop)
        raise
    return sub
