#!/usr/bin/env python3
"""Soak test: many requests at a fixed concurrency, some cut off mid-stream, some malformed;
then the server must go idle with nothing leaked.

    python loadtest/soak.py --base-url http://127.0.0.1:8000 --num-requests 2000 \
        --concurrency 32 --disconnect-rate 0.1 --bad-rate 0.1 --server-pid $(pgrep -f 'vtllm serve')

Each request ends exactly once as completed (every check passed), aborted (we disconnected),
rejected (a deliberately bad request answered with a 4xx OpenAI error envelope) or error
(anything else). Afterwards /metrics must show no KV blocks, tracked, running or waiting
requests, and the server's RSS (with --server-pid) must not have grown past a bound since the
warm-up. Exit status: 0 every invariant held, 1 one failed or the server is unusable, 2 flags.
HTTP only: imports nothing from vtllm (the stream checker is stream_check.py).
"""

import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_check import (  # noqa: E402
    CHAT,
    COMPLETIONS,
    WORDS,
    OneLineParser,
    StreamCheck,
    envelope_message,
    metric,
    parse_metrics,
    streaming_payload,
)

COMPLETED, ABORTED, REJECTED, ERROR = "completed", "aborted", "rejected", "error"
GAUGES = (
    "vt:kv_cache_used_blocks",
    "vt:tracked_requests",
    "vt:num_requests_running",
    "vt:num_requests_waiting",
)
DISCONNECT_MODES = ("mid-stream", "after-headers", "whole-cancel")
MSG = [{"role": "user", "content": "hi"}]
J = "application/json"
# (name, path, body: bytes or JSON value, content type) -- each must get a 4xx envelope
BAD = [
    ("truncated-json", COMPLETIONS, b'{"prompt": "x", "max_tokens": ', J),
    ("not-json", CHAT, b"messages=hi", J),
    ("form-content-type", COMPLETIONS, b"prompt=x", "application/x-www-form-urlencoded"),
    ("body-is-array", COMPLETIONS, [1, 2], J),
    ("no-prompt", COMPLETIONS, {"max_tokens": 4}, J),
    ("empty-messages", CHAT, {"messages": []}, J),
    ("bad-role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, J),
    ("n-zero", COMPLETIONS, {"prompt": "x", "n": 0}, J),
    ("max-tokens-negative", CHAT, {"messages": MSG, "max_tokens": -1}, J),
    ("max-tokens-string", COMPLETIONS, {"prompt": "x", "max_tokens": "ten"}, J),
    ("max-tokens-huge", COMPLETIONS, {"prompt": "x", "max_tokens": 10**9}, J),
    ("token-out-of-vocab", COMPLETIONS, {"prompt": [10**8], "max_tokens": 2}, J),
    ("unknown-model", CHAT, {"messages": MSG, "model": "no-such-model"}, J),
    ("temperature-string", CHAT, {"messages": MSG, "temperature": "hot"}, J),
    ("top-p-zero-stream", COMPLETIONS, {"prompt": "x", "top_p": 0, "stream": True}, J),
    ("stream-max-tokens-0", CHAT, {"messages": MSG, "max_tokens": 0, "stream": True}, J),
    ("top-logprobs-alone", CHAT, {"messages": MSG, "top_logprobs": 2, "stream": True}, J),
    ("stop-int", COMPLETIONS, {"prompt": "x", "stop": 7}, J),
]


@dataclass(slots=True)
class Ledger:
    """One outcome per request; ending a request twice is itself an invariant failure."""

    outcome: dict[int, str] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)  # error kinds
    variants: Counter = field(default_factory=Counter)  # (variant, outcome)
    doubles: list[int] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)

    def end(self, index: int, variant: str, outcome: str, kind: str = "", detail: str = ""):
        if index in self.outcome:
            self.doubles.append(index)
            return
        self.outcome[index] = outcome
        self.variants[(variant, outcome)] += 1
        if outcome == ERROR:
            self.kinds[kind] += 1
            if len(self.first_errors) < 5:
                self.first_errors.append(f"#{index} {variant}: {kind}: {detail}"[:240])


# -- the three kinds of request ---------------------------------------------------------------


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _good_body(rng: random.Random, args, chat: bool, stream: bool, count: str, max_tokens: int):
    if chat:
        prompt = _words(rng, 3, 40)
    elif rng.random() < 0.5:
        prompt = [rng.randrange(1000, 10000) for _ in range(rng.randint(4, 64))]
    else:
        prompt = _words(rng, 3, 40)
    body = streaming_payload(chat, prompt, max_tokens, count=count, model=args.model)
    if not stream:
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return body, prompt


async def normal(client, args, rng: random.Random, ledger: Ledger, i: int) -> None:
    chat, stream = rng.random() < 0.5, rng.random() < 0.7
    max_tokens, ignore_eos = rng.randint(1, args.max_tokens), rng.random() < 0.5
    count = "logprobs" if rng.random() < 0.5 else "usage"
    include_usage = count == "usage" or rng.random() < 0.5
    body, prompt = _good_body(rng, args, chat, stream, count, max_tokens)
    body["ignore_eos"] = ignore_eos
    if stream and not include_usage:
        del body["stream_options"]
    variant = f"{'chat' if chat else 'cmpl'}-{'stream' if stream else 'whole'}"
    url = args.base_url + (CHAT if chat else COMPLETIONS)
    check = StreamCheck(
        chat=chat,
        count=count,
        include_usage=include_usage,
        max_tokens=max_tokens,
        expect_tokens=max_tokens if ignore_eos else None,
        expect_prompt=len(prompt) if isinstance(prompt, list) else None,
    )
    try:
        async with asyncio.timeout(args.request_timeout):
            if stream:
                async with client.stream("POST", url, json=body) as resp:
                    if resp.status_code != 200 or "event-stream" not in _ctype(resp):
                        await resp.aread()
                        _refused(check, resp)
                    else:
                        async for data in resp.aiter_bytes():
                            check.feed(data)
                            if check.error:
                                break
                        check.finish()
            else:
                resp = await client.post(url, json=body)
                _check_whole(check, resp, chat, max_tokens, ignore_eos)
    except (TimeoutError, httpx.HTTPError) as exc:
        check.fail("timeout" if isinstance(exc, TimeoutError) else "http_error", repr(exc))
    _end(ledger, i, variant, check)


def _end(ledger: Ledger, i: int, variant: str, check: StreamCheck) -> None:
    if check.error is None:
        ledger.end(i, variant, COMPLETED)
    elif check.error[0] == "overloaded":  # a well-formed 429: the server refused in time
        ledger.end(i, variant + "-429", REJECTED)
    else:
        ledger.end(i, variant, ERROR, *check.error)


def _ctype(resp: httpx.Response) -> str:
    return resp.headers.get("content-type", "")


def _envelope(resp: httpx.Response) -> bool:
    try:
        err = resp.json()["error"]
        return isinstance(err["message"], str) and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError):
        return False


def _refused(check: StreamCheck, resp: httpx.Response) -> None:
    """A good request that got no 200: a 429 with Retry-After is overload, the rest errors."""
    if resp.status_code == 429 and "retry-after" in resp.headers and _envelope(resp):
        check.fail("overloaded", resp.headers["retry-after"])
    else:
        check.fail("http_status", f"{resp.status_code}: {envelope_message(resp.content)}")


def _check_whole(check: StreamCheck, resp, chat: bool, max_tokens: int, ignore_eos: bool):
    if resp.status_code != 200:
        _refused(check, resp)
        return
    try:
        obj = resp.json()
        choice, usage = obj["choices"][0], obj["usage"]
        text = choice["message"]["content"] if chat else choice["text"]
        reason, n = choice["finish_reason"], usage["completion_tokens"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        check.fail("bad_response", f"{exc!r}: {resp.text[:120]!r}")
        return
    if not isinstance(text, str) or reason not in ("stop", "length"):
        check.fail("bad_response", f"text {type(text).__name__}, finish_reason {reason!r}")
    elif n > max_tokens or ignore_eos and (n != max_tokens or reason != "length"):
        check.fail("length_mismatch", f"{n} tokens ({reason}) for max_tokens {max_tokens}")


async def disconnect(client, args, rng: random.Random, ledger: Ledger, i: int) -> None:
    """Leaves mid-stream (after k token events), right after the headers, or mid-way through
    a whole (non-streamed) response. A response that ends first counts as completed."""
    chat = rng.random() < 0.5
    variant = rng.choice(args.disconnect_modes)
    body, _ = _good_body(
        rng, args, chat, variant != "whole-cancel", "usage", args.disconnect_tokens
    )
    body["ignore_eos"] = True  # long enough that we leave while it runs
    url = args.base_url + (CHAT if chat else COMPLETIONS)
    tag = f"disconnect-{variant}"
    try:
        async with asyncio.timeout(args.request_timeout):
            if variant == "whole-cancel":
                try:
                    async with asyncio.timeout(rng.uniform(0.01, 0.5)):
                        resp = await client.post(url, json=body)
                except TimeoutError:
                    ledger.end(i, tag, ABORTED)
                    return
                check = StreamCheck(chat=chat, count="usage")  # ended before we left
                _check_whole(check, resp, chat, args.disconnect_tokens, True)
                _end(ledger, i, tag, check)
                return
            check = StreamCheck(chat=chat, count="usage")
            leave_after = 0 if variant == "after-headers" else rng.randint(1, 4)
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200 or "event-stream" not in _ctype(resp):
                    await resp.aread()
                    _refused(check, resp)
                    _end(ledger, i, tag, check)
                    return
                events = 0
                if leave_after:
                    async for data in resp.aiter_bytes():
                        events += sum(n > 0 for n in check.feed(data))
                        if check.error or events >= leave_after:
                            break
                if check.error or events < leave_after:  # failed, or ended before we could leave
                    check.finish()
                    _end(ledger, i, tag, check)
                    return
            # leaving the `async with` early closes the connection: the server sees a disconnect
            ledger.end(i, tag, ABORTED)
    except (TimeoutError, httpx.HTTPError) as exc:
        ledger.end(i, tag, ERROR, "timeout" if isinstance(exc, TimeoutError) else "http", repr(exc))


async def bad(client, args, rng: random.Random, ledger: Ledger, i: int) -> None:
    name, path, body, ctype = rng.choice(BAD)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    tag = f"bad-{name}"
    try:
        async with asyncio.timeout(args.request_timeout):
            resp = await client.post(
                args.base_url + path, content=raw, headers={"content-type": ctype}
            )
    except (TimeoutError, httpx.HTTPError) as exc:
        ledger.end(i, tag, ERROR, "timeout" if isinstance(exc, TimeoutError) else "http", repr(exc))
        return
    if 400 <= resp.status_code < 500 and _envelope(resp) and "json" in _ctype(resp):
        ledger.end(i, tag, REJECTED)
    else:
        detail = f"HTTP {resp.status_code} {_ctype(resp)}: {resp.text[:120]!r}"
        ledger.end(i, tag, ERROR, "bad_not_rejected", detail)


# -- the run -----------------------------------------------------------------------------------


async def run_phase(client, args, start: int, n: int, deadline: float, ledger: Ledger) -> int:
    """n requests (indexes start..start+n-1) on `concurrency` workers; returns how many began."""
    rng = random.Random(args.seed * 1_000_003 + start)
    plan = []
    for _ in range(n):
        x = rng.random()
        if x < args.bad_rate:
            kind = bad
        elif x < args.bad_rate + args.disconnect_rate:
            kind = disconnect
        else:
            kind = normal
        plan.append((kind, rng.getrandbits(64)))
    queue = list(enumerate(plan, start))[::-1]
    began = 0

    async def worker():
        nonlocal began
        while queue and time.monotonic() < deadline:
            i, (kind, seed) = queue.pop()
            began += 1
            try:
                await kind(client, args, random.Random(seed), ledger, i)
            except Exception as exc:  # a surprise (or a bug here) still ends the request once
                ledger.end(i, kind.__name__, ERROR, "unexpected", repr(exc))

    async with asyncio.TaskGroup() as tg:
        for _ in range(args.concurrency):
            tg.create_task(worker())
    return began


async def read_metrics(client, base: str) -> dict[str, float]:
    return parse_metrics((await client.get(base + "/metrics")).text)


async def wait_idle(client, args) -> tuple[dict[str, float], float]:
    started = time.monotonic()
    while True:
        m = await read_metrics(client, args.base_url)
        if all(m.get(g) == 0 for g in GAUGES) or time.monotonic() - started > args.idle_timeout:
            return m, time.monotonic() - started
        await asyncio.sleep(0.1)


async def wait_ready(client, args) -> None:
    """With --wait-ready S, polls /health for up to S seconds (a server still loading)."""
    deadline = time.monotonic() + args.wait_ready
    while time.monotonic() < deadline:
        try:
            if (await client.get(args.base_url + "/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


class Unusable(Exception):
    pass


@dataclass(slots=True)
class Observed:
    """What the server looked like around the measured run (after the warm-up)."""

    began: int = 0  # requests started, warm-up included
    elapsed: float = 0.0
    left: float = 0.0  # tracked requests as the last client finished
    final: dict = field(default_factory=dict)  # /metrics once idle (or given up)
    idle_s: float = 0.0
    served: float | None = None  # engine requests finished during the run (request_success)
    rss: tuple[float, float] | None = None  # MiB after the warm-up, at the end
    peak_rss: float | None = None  # MiB, sampled twice a second over the whole soak
    health: int | None = None


async def sample_peak_rss(pid: int, obs: Observed) -> None:
    while True:
        try:
            obs.peak_rss = max(obs.peak_rss or 0.0, rss_mib(pid))
        except (OSError, ValueError):
            return
        await asyncio.sleep(0.5)


async def soak(args) -> int:
    timeout = httpx.Timeout(args.read_timeout, connect=args.connect_timeout, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await wait_ready(client, args)
        try:
            m = await read_metrics(client, args.base_url)
        except httpx.HTTPError as exc:
            raise Unusable(f"cannot reach {args.base_url}/metrics: {exc!r}") from None
        missing = [g for g in GAUGES if g not in m]
        if missing:
            raise Unusable(f"{args.base_url}/metrics lacks {', '.join(missing)}")
        ledger, obs = Ledger(), Observed()
        sampler = None
        if args.server_pid:
            sampler = asyncio.create_task(sample_peak_rss(args.server_pid, obs))
        t0 = time.monotonic()
        end = t0 + args.duration_limit
        obs.began = await run_phase(client, args, 0, args.warmup, end, ledger)
        warm, _ = await wait_idle(client, args)
        rss0 = rss_mib(args.server_pid) if args.server_pid else None
        obs.began += await run_phase(client, args, args.warmup, args.num_requests, end, ledger)
        obs.elapsed = time.monotonic() - t0
        obs.left = (await read_metrics(client, args.base_url)).get("vt:tracked_requests", 0.0)
        obs.final, obs.idle_s = await wait_idle(client, args)
        if rss0 is not None:
            obs.rss = rss0, rss_mib(args.server_pid)
        if sampler is not None:
            sampler.cancel()
        success = metric(warm, "request_success"), metric(obs.final, "request_success")
        if None not in success:
            obs.served = success[1] - success[0]
        try:
            obs.health = (await client.get(args.base_url + "/health")).status_code
        except httpx.HTTPError:
            pass
    return report(args, ledger, obs)


def _invariants(args, ledger: Ledger, obs: Observed) -> list[tuple[str, bool, str]]:
    counts = Counter(ledger.outcome.values())
    final = obs.final
    checks = [
        (
            "every request ended exactly once",
            len(ledger.outcome) == obs.began and not ledger.doubles,
            f"{len(ledger.outcome)}/{obs.began} ended, {len(ledger.doubles)} twice",
        ),
        ("no request ended in error", counts[ERROR] == 0, str(counts[ERROR])),
        ("server idle again", all(final.get(g) == 0 for g in GAUGES), f"after {obs.idle_s:.1f} s"),
        # Every client is gone by now: whatever still runs was left by us and must be aborted.
        (
            f"idle within {args.abort_grace:g} s of the last client",
            obs.idle_s <= args.abort_grace,
            f"{obs.left:g} were tracked then",
        ),
    ]
    checks += [(f"{g} == 0", final.get(g) == 0, f"{final.get(g)}") for g in GAUGES]
    if obs.served is not None:
        # Server side, each request that reached the engine finishes once: every completed
        # one, and those we left unless we left before the server read them.
        run = Counter(o for i, o in ledger.outcome.items() if i >= args.warmup)
        lo, hi = run[COMPLETED], run[COMPLETED] + run[ABORTED]
        checks.append(
            (
                "server finished each request once",
                lo <= obs.served <= hi,
                f"{obs.served:g} in [{lo}, {hi}]",
            )
        )
    checks.append(("/health is 200 afterwards", obs.health == 200, str(obs.health)))
    if obs.rss is not None:
        rss0, rss1 = obs.rss
        bound = rss0 * args.rss_growth_frac + args.rss_growth_mib
        checks.append(
            (
                f"RSS growth <= {args.rss_growth_frac:.0%} + {args.rss_growth_mib:g} MiB",
                rss1 - rss0 <= bound,
                f"{rss0:.0f} -> {rss1:.0f} MiB ({rss1 - rss0:+.1f})",
            )
        )
    return checks


def report(args, ledger: Ledger, obs: Observed) -> int:
    planned = args.warmup + args.num_requests
    counts = Counter(ledger.outcome.values())
    w = 64
    row = lambda name, value: print(f"{name:<44}{value:>20}")  # noqa: E731
    print("{s:{c}^{n}}".format(s=" Soak summary ", n=w, c="="))
    row("requests planned (warm-up + run)", planned)
    row("requests started", obs.began)
    for outcome in (COMPLETED, ABORTED, REJECTED, ERROR):
        row("  " + outcome, counts[outcome])
    if planned > obs.began:
        row("  not started (--duration-limit)", planned - obs.began)
    row("wall time (s)", f"{obs.elapsed:.1f}")
    if obs.peak_rss is not None:
        row("server peak RSS (MiB)", f"{obs.peak_rss:.0f}")
    row("KV blocks in use afterwards", f"{obs.final.get('vt:kv_cache_used_blocks')}")
    row("requests/s", f"{obs.began / max(obs.elapsed, 1e-9):.1f}")
    print("{s:{c}^{n}}".format(s=" by variant ", n=w, c="-"))
    for (variant, outcome), n in sorted(ledger.variants.items()):
        row(f"  {variant} {outcome}", n)
    if ledger.kinds:
        print("{s:{c}^{n}}".format(s=" errors ", n=w, c="-"))
        for kind, n in sorted(ledger.kinds.items()):
            row("  " + kind, n)
        for line in ledger.first_errors:
            print(f"  {line}")
    checks = _invariants(args, ledger, obs)
    print("{s:{c}^{n}}".format(s=" invariants ", n=w, c="-"))
    for name, ok, detail in checks:
        print(f"[{'PASS' if ok else 'FAIL'}] {name:<38}{detail:>20}")
    print("=" * w)
    failed = [name for name, ok, _ in checks if not ok]
    if failed:
        print(f"soak: FAILED: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def parse_args(argv=None):
    p = OneLineParser(prog="soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", help="model name to send (default: none, the server's)")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--disconnect-rate", type=float, default=0.1)
    p.add_argument("--bad-rate", type=float, default=0.1)
    p.add_argument("--duration-limit", type=float, default=3600.0, help="stop starting (s)")
    p.add_argument("--warmup", type=int, help="requests before the RSS baseline (2 x conc.)")
    p.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens of a request")
    p.add_argument("--disconnect-tokens", type=int, default=256, help="max_tokens of leavers")
    p.add_argument(
        "--disconnect-modes",
        default=",".join(DISCONNECT_MODES),
        help="comma list of: " + ", ".join(DISCONNECT_MODES),
    )
    p.add_argument("--abort-grace", type=float, default=10.0, help="idle after clients left (s)")
    p.add_argument("--server-pid", type=int, help="check this process's RSS growth")
    p.add_argument("--rss-growth-mib", type=float, default=50.0)
    p.add_argument("--rss-growth-frac", type=float, default=0.10)
    p.add_argument("--idle-timeout", type=float, default=60.0, help="wait for idle (s)")
    p.add_argument("--wait-ready", type=float, default=0.0, help="wait for /health 200 (s)")
    p.add_argument("--connect-timeout", type=float, default=5.0)
    p.add_argument("--read-timeout", type=float, default=60.0)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.concurrency < 1 or args.max_tokens < 1:
        p.error("--num-requests, --concurrency and --max-tokens must be >= 1")
    if args.disconnect_tokens < 8:
        p.error("--disconnect-tokens must be >= 8")
    rates = (args.disconnect_rate, args.bad_rate)
    if min(rates) < 0 or sum(rates) > 1:
        p.error("--disconnect-rate and --bad-rate are shares in [0, 1] summing to <= 1")
    for name in (
        "duration_limit",
        "idle_timeout",
        "abort_grace",
        "connect_timeout",
        "read_timeout",
    ):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    args.disconnect_modes = [m for m in args.disconnect_modes.split(",") if m]
    unknown = set(args.disconnect_modes) - set(DISCONNECT_MODES)
    if unknown or not args.disconnect_modes:
        p.error(f"--disconnect-modes takes {', '.join(DISCONNECT_MODES)}; got {unknown or 'none'}")
    if args.warmup is None:
        args.warmup = 2 * args.concurrency
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.server_pid is not None and not os.path.exists(f"/proc/{args.server_pid}/status"):
        p.error(f"--server-pid {args.server_pid}: no such process")
    args.base_url = args.base_url.rstrip("/")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(soak(args))
    except Unusable as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
