#!/usr/bin/env python3
"""Online serving benchmark for OpenAI-compatible servers, after `vllm bench serve`.

    python loadtest/bench_serve.py --base-url http://127.0.0.1:8000 --endpoint completions \
        --num-prompts 200 --input-len 256 --output-len 64 --max-concurrency 8 --ignore-eos

Talks HTTP only (httpx) and imports nothing from vtllm, so it runs against any server. Every
stream is verified while it is timed (stream_check.StreamCheck); a request that fails a check is a
failed request, counted by kind. Exit status: 0 all requests passed, 1 a request failed or the
server could not be used, 2 bad flags. Needs only httpx and stream_check.py beside it, so
loadtest/ can be copied to another machine and run against another engine.
"""

import argparse
import asyncio
import json
import math
import os
import random
import ssl
import sys
import time
from dataclasses import asdict, dataclass, field

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

# -- datasets --------------------------------------------------------------------------------


@dataclass(slots=True)
class Prompt:
    index: int
    prompt: list[int] | str  # token ids (completions) or message text (chat)
    input_len: int  # tokens; exact for ids, checked with /tokenize for chat text
    output_len: int


def _lengths(rng: random.Random, n: int, fixed: int, span: tuple[int, int] | None) -> list[int]:
    return [rng.randint(*span) if span else fixed for _ in range(n)]


async def _count_tokens(client: httpx.AsyncClient, base: str, text: str) -> int | None:
    try:
        body = {"prompt": text, "add_special_tokens": False}
        r = await client.post(base + "/tokenize", json=body)
        return int(r.json()["count"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


async def _words_of_tokens(client, base: str, rng: random.Random, length: int) -> tuple[str, int]:
    """Random words adjusted until /tokenize says they are `length` tokens (or close)."""
    words = [rng.choice(WORDS) for _ in range(length)]
    count = length
    for _ in range(6):
        count = await _count_tokens(client, base, " ".join(words))
        if count is None:  # no /tokenize: a word is about a token
            return " ".join(words), len(words)
        if count == length:
            break
        if count > length:
            del words[max(1, len(words) - (count - length)) :]
        else:
            words += [rng.choice(WORDS) for _ in range(length - count)]
    return " ".join(words), count


async def make_prompts(args, client: httpx.AsyncClient, n: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    ins = _lengths(rng, n, args.input_len, args.input_len_range)
    outs = _lengths(rng, n, args.output_len, args.output_len_range)
    lo, hi = args.token_range
    if args.endpoint == "completions":
        prefix = [rng.randrange(lo, hi) for _ in range(args.shared_prefix)]
        ids = [prefix + [rng.randrange(lo, hi) for _ in range(ins[i])] for i in range(n)]
        return [Prompt(i, ids[i], len(ids[i]), outs[i]) for i in range(n)]
    prefix = ""
    if args.shared_prefix:
        prefix, _ = await _words_of_tokens(client, args.base_url, rng, args.shared_prefix)
        prefix += " "
    out = []
    for i in range(n):
        text, _ = await _words_of_tokens(client, args.base_url, rng, ins[i])
        count = await _count_tokens(client, args.base_url, prefix + text)
        out.append(Prompt(i, prefix + text, count or len((prefix + text).split()), outs[i]))
    return out


# -- one request -----------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    index: int
    input_len: int
    output_len: int  # requested (max_tokens)
    ok: bool = False
    error: str | None = None  # failure kind
    detail: str | None = None
    start: float = 0.0  # seconds since the benchmark started
    ttft: float | None = None  # seconds
    e2el: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    num_replacement: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2el is None or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


async def send(client: httpx.AsyncClient, args, model: str | None, p: Prompt, t0: float):
    chat = args.endpoint == "chat"
    body = streaming_payload(chat, p.prompt, p.output_len, count=args.token_count, model=model)
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.temperature is not None:
        body["temperature"] = args.temperature
    body.update(args.extra_body)
    check = StreamCheck(
        chat=chat,
        count=args.token_count,
        max_tokens=p.output_len,
        expect_tokens=p.output_len if args.ignore_eos else None,
        expect_prompt=None if chat else len(p.prompt),
        usage_with_finish=args.usage_with_finish,
    )
    res = Result(p.index, p.input_len, p.output_len)
    start = time.perf_counter()
    res.start = start - t0
    try:
        async with asyncio.timeout(args.request_timeout):
            await _stream(client, args.base_url + (CHAT if chat else COMPLETIONS), body, check, res)
    except TimeoutError:
        check.fail("timeout", f"no complete response within {args.request_timeout} s")
    except httpx.TimeoutException as exc:
        check.fail("timeout", f"{type(exc).__name__}: {exc}")
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        check.fail("connect_error", f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        check.fail("read_error", f"{type(exc).__name__}: {exc}")
    res.e2el = time.perf_counter() - start
    res.finish_reason = check.finish_reason
    res.output_tokens = check.output_tokens or 0
    res.num_replacement = check.num_replacement
    if check.usage is not None:
        res.prompt_tokens = check.usage["prompt_tokens"]
    res.ok = check.error is None
    if check.error is not None:
        res.error, res.detail = check.error
    return res


async def _stream(client, url: str, body: dict, check: StreamCheck, res: Result) -> None:
    start = time.perf_counter()
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            check.fail("http_status", f"HTTP {resp.status_code}: {envelope_message(raw)}")
            return
        ctype = resp.headers.get("content-type", "")
        if not ctype.startswith("text/event-stream"):
            check.fail("not_sse", f"content-type {ctype!r}, not text/event-stream")
            return
        last = start
        async for data in resp.aiter_bytes():
            now = time.perf_counter()
            for n in check.feed(data):
                if n <= 0:
                    continue
                if res.ttft is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
            if check.error is not None:
                return
    check.finish()


# -- the run ---------------------------------------------------------------------------------


class Lanes:
    """An httpx client for each request in flight, reused by the next. One client shared by
    all scans every pooled connection on each request event (httpcore's pool): at 64 streams
    this process spent ~175 us of CPU a streamed token that way, ~80 with lanes, and the
    client, not the server, was the limit (bench/host_cost_serve.py)."""

    def __init__(self, make_client):
        self.make_client = make_client
        self.idle: list[httpx.AsyncClient] = []
        self.all: list[httpx.AsyncClient] = []

    def take(self) -> httpx.AsyncClient:
        if self.idle:
            return self.idle.pop()
        client = self.make_client()
        self.all.append(client)
        return client

    def give_back(self, client: httpx.AsyncClient) -> None:
        self.idle.append(client)

    async def close(self) -> None:
        for client in self.all:
            await client.aclose()


async def run_all(args, make_client, model, prompts: list[Prompt], rate: float, concurrency):
    """Sends prompts with gamma-distributed gaps (Poisson when burstiness is 1) and at most
    `concurrency` in flight; returns results and the wall time from first send to last end."""
    rng = random.Random(args.seed + 1)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    lanes = Lanes(make_client)
    t0 = time.perf_counter()

    async def on_a_lane(p: Prompt) -> Result:
        client = lanes.take()
        try:
            return await send(client, args, model, p, t0)
        finally:
            lanes.give_back(client)

    async def one(p: Prompt) -> Result:
        if sem is None:
            return await on_a_lane(p)
        async with sem:
            return await on_a_lane(p)

    tasks, due = [], t0
    try:
        for p in prompts:
            tasks.append(asyncio.create_task(one(p)))
            if math.isfinite(rate):
                due += rng.gammavariate(args.burstiness, 1.0 / (rate * args.burstiness))
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0
    finally:
        await lanes.close()


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values_s: list[float]) -> dict:
    if not values_s:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    ms = [v * 1000 for v in values_s]
    return {
        "mean": sum(ms) / len(ms),
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def summarize(args, results: list[Result], duration: float, prefix_hits=None) -> dict:
    ok = [r for r in results if r.ok]
    failures: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failures[r.error] = failures.get(r.error, 0) + 1
    reasons: dict[str, int] = {}
    for r in ok:
        reasons[str(r.finish_reason)] = reasons.get(str(r.finish_reason), 0) + 1
    n_in = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    good = [r for r in ok if meets_slo(r, args.slo)]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "failures": failures,
        "finish_reasons": reasons,
        "duration_s": duration,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "request_goodput": len(good) / duration if duration and args.slo else None,
        "output_throughput": n_out / duration if duration else 0.0,
        "total_token_throughput": (n_in + n_out) / duration if duration else 0.0,
        "ttft_ms": _stats([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": _stats([x for r in ok for x in r.itl]),
        "e2el_ms": _stats([r.e2el for r in ok]),
        "chunks_with_replacement_char": sum(r.num_replacement for r in ok),
        "prefix_cache_hit_rate": prefix_hits,
        "slo_ms": args.slo or None,
    }


def meets_slo(r: Result, slo: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.e2el}
    return all(values[k] is None or values[k] * 1000 <= v for k, v in slo.items())


def print_report(args, s: dict) -> None:
    w = 50
    row = lambda name, value: print(f"{name + ':':<40}{value:>10}")  # noqa: E731
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="="))
    row("Successful requests", s["completed"])
    row("Failed requests", s["failed"])
    for kind, n in sorted(s["failures"].items()):
        row(f"  failed: {kind}", n)
    conc = args.max_concurrency or "unlimited"
    row("Request rate configured (RPS)", f"{args.request_rate:.2f}")
    row("Maximum request concurrency", conc)
    row("Seed", args.seed)
    row("Benchmark duration (s)", f"{s['duration_s']:.2f}")
    row("Total input tokens", s["total_input_tokens"])
    row("Total generated tokens", s["total_output_tokens"])
    row("Request throughput (req/s)", f"{s['request_throughput']:.2f}")
    if s["request_goodput"] is not None:
        row("Request goodput (req/s)", f"{s['request_goodput']:.2f}")
    row("Output token throughput (tok/s)", f"{s['output_throughput']:.2f}")
    row("Total Token throughput (tok/s)", f"{s['total_token_throughput']:.2f}")
    for name, (key, title) in {
        "TTFT": ("ttft_ms", "Time to First Token"),
        "TPOT": ("tpot_ms", "Time per Output Token (excl. 1st token)"),
        "ITL": ("itl_ms", "Inter-token Latency"),
        "E2EL": ("e2el_ms", "End-to-end Latency"),
    }.items():
        print("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            value = s[key][stat]
            row(f"{label} {name} (ms)", "n/a" if value is None else f"{value:.2f}")
    print("{s:{c}^{n}}".format(s="Checks", n=w, c="-"))
    for reason, n in sorted(s["finish_reasons"].items()):
        row(f"finish_reason {reason}", n)
    row("Chunks with U+FFFD", s["chunks_with_replacement_char"])
    if args.usage_with_finish:
        row("Usage on the finish chunk accepted", "yes")
    if s["prefix_cache_hit_rate"] is not None:
        row("Prefix cache hit rate (server)", f"{s['prefix_cache_hit_rate']:.1%}")
    print("=" * w)


# -- CLI -------------------------------------------------------------------------------------


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI integers, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 0 <= LO <= HI, got {text!r}")
    return lo, hi


def _slo(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in ("ttft", "tpot", "e2el"):
            raise argparse.ArgumentTypeError(f"SLO keys are ttft, tpot, e2el; got {key!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"SLO {key} needs milliseconds") from None
    return out


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(prog="bench_serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens")
    p.add_argument("--input-len-range", type=_range, help="LO:HI, uniform (overrides --input-len)")
    p.add_argument("--output-len-range", type=_range, help="LO:HI, uniform (over --output-len)")
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    p.add_argument("--token-range", type=_range, default=(1000, 10000), help="ids for prompts")
    p.add_argument("--request-rate", type=float, default=math.inf, help="req/s; inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 is Poisson")
    p.add_argument("--max-concurrency", type=int, help="requests in flight at most")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first, not measured")
    p.add_argument("--ignore-eos", action="store_true", help="fix output lengths at max_tokens")
    p.add_argument("--temperature", type=float, help="default: the server's")
    p.add_argument("--extra-body", type=_json_object, default={}, help="JSON merged into bodies")
    p.add_argument(
        "--token-count",
        choices=("logprobs", "usage"),
        default="logprobs",
        help="count streamed tokens by logprobs entries (exact), or trust usage",
    )
    p.add_argument(
        "--usage-with-finish",
        action="store_true",
        help="peers only: accept the usage on the finish_reason chunk instead of a chunk of its "
        "own (llama.cpp's llama-server on /v1/completions)",
    )
    p.add_argument(
        "--no-keepalive",
        action="store_true",
        help="a new connection per request (llama-server closes them after a stream)",
    )
    p.add_argument("--slo", type=_slo, default={}, help="goodput SLOs in ms: ttft=500,tpot=50")
    p.add_argument(
        "--seed",
        type=int,
        help="dataset and arrival seed (default: random, printed; a repeated seed re-sends "
        "prompts the server may still hold in its prefix cache)",
    )
    p.add_argument("--connect-timeout", type=float, default=5.0)
    p.add_argument("--read-timeout", type=float, default=60.0, help="longest silence (s)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="whole request (s)")
    p.add_argument("--save-json", help="write the summary and per-request timings here")
    args = p.parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.shared_prefix < 0:
        p.error("--warmup and --shared-prefix must be >= 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if not args.request_rate > 0 or args.burstiness <= 0:
        p.error("--request-rate and --burstiness must be > 0")
    for name in ("input_len_range", "output_len_range"):
        span = getattr(args, name)
        if span and span[0] < 1:
            p.error(f"--{name.replace('_', '-')} must start at >= 1")
    if args.token_range[1] <= args.token_range[0]:
        p.error("--token-range needs LO < HI")
    for name in ("connect_timeout", "read_timeout", "request_timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    args.base_url = args.base_url.rstrip("/")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    return args


class Unusable(Exception):
    """The server cannot be benchmarked; the message is the one line printed."""


async def resolve_model(client: httpx.AsyncClient, args) -> str | None:
    url = args.base_url + "/v1/models"
    try:
        r = await client.get(url)
    except httpx.HTTPError as exc:
        raise Unusable(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    if args.model:
        return args.model
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        ctype = r.headers.get("content-type", "?")
        raise Unusable(
            f"{url} gave HTTP {r.status_code} ({ctype}), not a model list; pass --model"
        ) from None


async def prefix_counters(client, base: str) -> tuple[float, float] | None:
    """(prompt tokens looked up, found) in the server's prefix cache, when /metrics has them."""
    try:
        values = parse_metrics((await client.get(base + "/metrics")).text)
    except httpx.HTTPError:
        return None
    queries, hits = metric(values, "prefix_cache_queries"), metric(values, "prefix_cache_hits")
    return None if queries is None or hits is None else (queries, hits)


def _tls_context() -> ssl.SSLContext:
    """What httpx builds for each client by default (certifi's CAs where installed)."""
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


async def main_async(args) -> int:
    timeout = httpx.Timeout(args.read_timeout, connect=args.connect_timeout, pool=None)
    # --no-keepalive: a connection per request, for servers that close a connection after a
    # streamed response while announcing keep-alive (a reused one then fails on the next send).
    keep = 0 if args.no_keepalive else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=keep)

    tls = _tls_context()  # one for all clients: building one costs ~40 ms of CPU

    def make_client() -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls)

    async with make_client() as client:
        model = await resolve_model(client, args)
        prompts = await make_prompts(args, client, args.num_prompts, args.seed)
        if args.warmup:
            warm = await make_prompts(args, client, args.warmup, args.seed + 7919)
            results, _ = await run_all(
                args, make_client, model, warm, math.inf, args.max_concurrency
            )
            bad = sum(not r.ok for r in results)
            if bad:
                print(f"bench_serve: {bad}/{len(results)} warm-up requests failed", file=sys.stderr)
        before = await prefix_counters(client, args.base_url)
        results, duration = await run_all(
            args, make_client, model, prompts, args.request_rate, args.max_concurrency
        )
        after = await prefix_counters(client, args.base_url)
    hits = None
    if before and after and after[0] > before[0]:
        hits = (after[1] - before[1]) / (after[0] - before[0])
    summary = summarize(args, results, duration, hits)
    print_report(args, summary)
    if args.save_json:
        record = {
            "config": vars(args) | {"model": model, "request_rate": str(args.request_rate)},
            "summary": summary,
            "requests": [asdict(r) | {"tpot": r.tpot} for r in results],
        }
        with open(args.save_json, "w") as f:
            json.dump(record, f, indent=1, default=str)
    for r in results:
        if not r.ok:
            print(f"bench_serve: request {r.index} failed: {r.error}: {r.detail}", file=sys.stderr)
            break
    return 0 if summary["failed"] == 0 else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except Unusable as exc:
        print(f"bench_serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_serve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
