"""Request bodies to token ids off the event loop, within a budget.

Checking, template rendering (pure Python) and tokenizing (Rust; the GIL is released for long
texts, see models/tokenizer.py) of a large body can take most of a second. On the event loop
that time would be a gap in every stream, so the work runs in a pool of its own, at most
`PREPROCESS_THREADS` requests at a time; the rest wait their turn.

Off the loop the work still takes a core from the step loop's kernels, which use every
core: on a machine with few cores, tokenizing a long prompt stretches the other streams'
gaps. So the budget is also one of work: the body (VT_MAX_BODY_BYTES), the prompt's
characters per request (VT_SERVER_MAX_PROMPT_CHARS), messages and prompts per request
(validate.py), the rendered chat (routes._render), and the context: a prompt that cannot fit
is refused before it is tokenized (Tokenizer.min_tokens, and the length of token-id
prompts), and the first prompt found too long ends the request's tokenizing.
Small requests stay on the loop, where the thread hop would cost more than the work.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

PREPROCESS_THREADS = 2
SMALL_WORK = 20_000  # bytes of prompt checked and tokenized on the event loop

_pool = ThreadPoolExecutor(PREPROCESS_THREADS, "vt-preprocess")


async def run(fn, work: int | None = None):
    """fn() on the loop when `work` is small, else in a worker thread under the budget
    (`work` None: always in a thread)."""
    if work is not None and work <= SMALL_WORK:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(_pool, fn)
