"""Locust users for an OpenAI-compatible server: streamed chat and completions, every stream
checked with stream_check.StreamCheck, TTFT / ITL / E2E latency reported as custom metrics.

    locust -f loadtest/locustfile.py --headless -u 32 -r 8 -t 60s --host http://127.0.0.1:8000

Extra options (after the locust ones): --input-len 128 --output-len 64 --ignore-eos
--model NAME --token-count logprobs|usage. Besides the POST rows (time to response headers),
the stats table gets rows of type TTFT (first token), ITL (one per gap between token-bearing
chunks) and E2E (whole stream; its "Average size" is tokens received per request). A stream that
fails a check is a failed POST whose message names the check. locust is optional: install it
with the project's `loadtest` extra; nothing in the tests imports this file.
"""

import os
import random
import sys
import time

from locust import HttpUser, constant, events, task

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_check import CHAT, COMPLETIONS, WORDS, StreamCheck, streaming_payload  # noqa: E402


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens (approx. chat)")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens")
    parser.add_argument("--ignore-eos", action="store_true", help="fix output at max_tokens")
    parser.add_argument("--model", default="", help="model name (default: /v1/models)")
    parser.add_argument("--token-count", choices=("logprobs", "usage"), default="logprobs")


class _StreamingUser(HttpUser):
    abstract = True
    wait_time = constant(0)  # closed loop: each user sends its next request at once
    chat = False

    def on_start(self):
        opts = self.environment.parsed_options
        self.opts = opts
        self.model = opts.model if opts else ""
        if not self.model:
            with self.client.get("/v1/models", name="/v1/models", catch_response=True) as resp:
                try:
                    self.model = resp.json()["data"][0]["id"]
                except (ValueError, KeyError, IndexError, TypeError):
                    resp.failure(f"no model list at /v1/models (HTTP {resp.status_code})")
        self.rng = random.Random()

    def _fire(self, kind: str, name: str, ms: float, length: int = 0) -> None:
        self.environment.events.request.fire(
            request_type=kind,
            name=name,
            response_time=ms,
            response_length=length,
            exception=None,
            context={},
        )

    def _prompt(self, n: int):
        if self.chat:
            return " ".join(self.rng.choice(WORDS) for _ in range(n))
        return [self.rng.randrange(1000, 10000) for _ in range(n)]

    def _run(self) -> None:
        opts = self.opts
        input_len = opts.input_len if opts else 128
        output_len = opts.output_len if opts else 64
        count = opts.token_count if opts else "logprobs"
        ignore_eos = bool(opts and opts.ignore_eos)
        prompt = self._prompt(input_len)
        body = streaming_payload(self.chat, prompt, output_len, count=count, model=self.model)
        body["ignore_eos"] = ignore_eos
        check = StreamCheck(
            chat=self.chat,
            count=count,
            max_tokens=output_len,
            expect_tokens=output_len if ignore_eos else None,
            expect_prompt=None if self.chat else len(prompt),
        )
        path = CHAT if self.chat else COMPLETIONS
        start = last = time.perf_counter()
        first = None
        with self.client.post(path, json=body, stream=True, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"http_status: HTTP {resp.status_code}: {resp.text[:120]}")
                return
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                resp.failure(f"not_sse: content-type {resp.headers.get('content-type')!r}")
                return
            try:
                for data in resp.iter_content(chunk_size=None):
                    now = time.perf_counter()
                    for n in check.feed(data):
                        if n <= 0:
                            continue
                        if first is None:
                            first = now
                            self._fire("TTFT", path, (now - start) * 1000)
                        else:
                            self._fire("ITL", path, (now - last) * 1000)
                        last = now
                    if check.error:
                        break
            except Exception as exc:  # a dropped connection mid-stream
                check.fail("read_error", repr(exc))
            check.finish()
            if check.error:
                resp.failure(f"{check.error[0]}: {check.error[1]}")
                return
            resp.success()
        self._fire("E2E", path, (time.perf_counter() - start) * 1000, check.output_tokens or 0)


class ChatUser(_StreamingUser):
    chat = True

    @task
    def chat_stream(self):
        self._run()


class CompletionUser(_StreamingUser):
    @task
    def completion_stream(self):
        self._run()
