"""Checks for OpenAI-style SSE streams, shared by bench_serve.py, soak.py and locustfile.py.

HTTP-level only; imports nothing from vtllm. StreamCheck is fed raw bytes as they arrive and
keeps the first failed check as (kind, detail); a failed check is a failed request.
"""

import argparse
import json

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# Common English words; with a leading space most are one token in BPE vocabularies, so a
# prompt of L words is close to L tokens before the /tokenize correction.
WORDS = (
    "the of and to in is was for on that with as by at from his her they this have had are "
    "not but what all were when we there can an your which their said if do will each about "
    "how up out them then she many some so these would other into has more two like him see "
    "time could no make than first been its who now people my made over did down only way "
    "find use may water long little very after words called just where most know get through "
    "back much before go good new write our used me man too any day same right look think "
    "also around another came come work three word must because does part even place well "
    "such here take why things help put years different away again off went old number great "
    "tell men say small every found still between name should home big give air line set own "
    "under read last never us left end along while might next sound below saw something "
    "thought both few those always looked show large often together asked house world going "
    "want school important until form food keep children feet land side without boy once "
    "animals life enough took sometimes four head above kind began almost live page got earth"
).split()


class OneLineParser(argparse.ArgumentParser):
    """Flag errors are one line on stderr and exit status 2, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class StreamCheck:
    """Incremental SSE parser and checker for one streamed completion or chat completion.

    feed() takes raw bytes as they arrive and returns, for each complete `data:` event, the
    number of tokens it carried; finish() runs the end-of-stream checks. The first failed
    check is kept in `error` as (kind, detail). Tokens are counted from logprobs (completions
    `logprobs: 0` / chat `logprobs: true, top_logprobs: 0` give one entry per sampled token,
    however the server merges tokens into chunks) when count="logprobs"; with count="usage"
    a chunk counts as 1 when it carries text and the total comes from the usage chunk.
    """

    def __init__(
        self,
        *,
        chat: bool,
        count: str = "logprobs",
        include_usage: bool = True,
        max_tokens: int | None = None,
        expect_tokens: int | None = None,
        expect_prompt: int | None = None,
        usage_with_finish: bool = False,
    ):
        self.chat, self.count, self.include_usage = chat, count, include_usage
        # A peer-compatibility allowance, off by default: the usage may ride on the chunk that
        # carries the finish_reason instead of a chunk of its own with `choices == []` (llama.cpp's
        # llama-server does this on /v1/completions). Counts and placement are still checked.
        self.usage_with_finish = usage_with_finish
        self.max_tokens, self.expect_tokens, self.expect_prompt = (
            max_tokens,
            expect_tokens,
            expect_prompt,
        )
        self.error: tuple[str, str] | None = None
        self.num_tokens = 0  # from logprobs entries
        self.num_events = 0
        self.num_done = 0
        self.num_replacement = 0  # chunks whose text holds U+FFFD (a split UTF-8 sequence?)
        self.usage: dict | None = None
        self.num_usage = 0
        self.finish_reason: str | None = None
        self.text: list[str] = []
        self._id = None
        self._buf = b""
        self._data: list[str] = []

    def fail(self, kind: str, detail: str) -> None:
        if self.error is None:
            self.error = (kind, detail[:300])

    def feed(self, data: bytes) -> list[int]:
        out = []
        self._buf += data
        while self.error is None:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            line, self._buf = self._buf[:nl].rstrip(b"\r"), self._buf[nl + 1 :]
            n = self._line(line)
            if n is not None:
                out.append(n)
        return out

    def _line(self, raw: bytes) -> int | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail("bad_utf8", f"SSE line is not UTF-8: {exc}")
            return None
        if not line:  # blank line: dispatch the event
            if not self._data:
                return None
            payload, self._data = "\n".join(self._data), []
            return self._event(payload)
        if line.startswith(":"):
            return None  # comment / keep-alive ping
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        elif name not in ("event", "id", "retry"):
            self.fail("bad_sse", f"not an SSE line: {line[:80]!r}")
        return None

    def _event(self, payload: str) -> int:
        self.num_events += 1
        if payload == "[DONE]":
            self.num_done += 1
            if self.num_done > 1:
                self.fail("duplicate_done", "[DONE] arrived more than once")
            return 0
        if self.num_done:
            self.fail("after_done", f"data after [DONE]: {payload[:80]!r}")
            return 0
        try:
            obj = json.loads(payload)
        except ValueError as exc:
            self.fail("bad_json", f"{exc}: {payload[:80]!r}")
            return 0
        if not isinstance(obj, dict):
            self.fail("bad_chunk", f"chunk is not an object: {payload[:80]!r}")
            return 0
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.fail("error_frame", f"error frame: {msg}")
            return 0
        return self._chunk(obj)

    def _chunk(self, obj: dict) -> int:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if obj.get("object") != kind:
            self.fail("bad_chunk", f"object is {obj.get('object')!r}, expected {kind!r}")
        if self._id is None:
            self._id = obj.get("id")
        elif obj.get("id") != self._id:
            self.fail("bad_chunk", f"id changed from {self._id!r} to {obj.get('id')!r}")
        choices, usage = obj.get("choices"), obj.get("usage")
        if not isinstance(choices, list):
            self.fail("bad_chunk", "choices is not a list")
            return 0
        if self.num_usage and choices:
            self.fail("usage_misplaced", "a content chunk after the usage chunk")
        if usage is not None:
            self.num_usage += 1
            if choices and not (self.usage_with_finish and self._finishes(choices)):
                self.fail("usage_misplaced", "usage on a chunk that has choices")
            elif not isinstance(usage, dict) or not all(
                isinstance(usage.get(k), int)
                for k in ("prompt_tokens", "completion_tokens", "total_tokens")
            ):
                self.fail("bad_chunk", f"malformed usage {usage!r}")
            else:
                self.usage = usage
            if not choices:
                return 0
        elif not choices:
            self.fail("bad_chunk", "a chunk with neither choices nor usage")
            return 0
        return sum(self._choice(c) for c in choices)

    @staticmethod
    def _finishes(choices: list) -> bool:
        return all(isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)

    def _choice(self, choice) -> int:
        if not isinstance(choice, dict) or choice.get("index") != 0:
            self.fail("bad_chunk", f"unexpected choice {str(choice)[:80]}")
            return 0
        if self.finish_reason is not None:
            self.fail("chunk_after_finish", "a chunk after the choice's finish_reason")
        if self.chat:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
        else:
            text = choice.get("text")
        if text is not None and not isinstance(text, str):
            self.fail("bad_chunk", f"text is {type(text).__name__}")
            return 0
        if text:
            try:
                text.encode("utf-8")  # catches lone surrogates sent as \ud8xx escapes
            except UnicodeEncodeError:
                self.fail("bad_utf8", f"text holds a lone surrogate: {text!r}")
            self.num_replacement += "\ufffd" in text
            self.text.append(text)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                self.fail("bad_chunk", f"finish_reason {reason!r}")
            self.finish_reason = str(reason)
        if self.count != "logprobs":
            return 1 if text else 0
        entries = self._logprob_entries(choice.get("logprobs"))
        if entries is None:
            if text:
                self.fail("missing_logprobs", "a chunk with text but no logprobs")
            return 0
        self.num_tokens += entries
        return entries

    def _logprob_entries(self, lp) -> int | None:
        if not isinstance(lp, dict):
            return None
        seq = lp.get("content") if self.chat else lp.get("tokens")
        return len(seq) if isinstance(seq, list) else None

    def finish(self) -> None:
        """End-of-stream checks; call once the body is fully read."""
        if self.error is not None:
            return
        if self._buf.strip() or self._data:
            self.fail("truncated", "the stream ended inside an event")
        elif self.num_done == 0:
            self.fail("missing_done", "no [DONE]")
        elif self.finish_reason is None:
            self.fail("no_finish", "no finish_reason")
        elif self.include_usage and self.num_usage != 1:
            self.fail("usage_count", f"{self.num_usage} usage chunks, expected 1")
        elif not self.include_usage and self.num_usage:
            self.fail("usage_count", "a usage chunk without stream_options.include_usage")
        if self.error is not None or self.usage is None and self.include_usage:
            return
        tokens = self.output_tokens
        if self.usage is not None:
            if self.count == "logprobs" and self.usage["completion_tokens"] != self.num_tokens:
                self.fail(
                    "usage_mismatch",
                    f"usage.completion_tokens={self.usage['completion_tokens']} but "
                    f"{self.num_tokens} tokens streamed",
                )
            total = self.usage["prompt_tokens"] + self.usage["completion_tokens"]
            if self.usage["total_tokens"] != total:
                self.fail("usage_mismatch", f"total_tokens != prompt + completion: {self.usage}")
            if self.expect_prompt is not None and self.usage["prompt_tokens"] != self.expect_prompt:
                self.fail(
                    "prompt_mismatch",
                    f"usage.prompt_tokens={self.usage['prompt_tokens']}, sent {self.expect_prompt}",
                )
        if self.max_tokens is not None and tokens is not None and tokens > self.max_tokens:
            self.fail("length_mismatch", f"{tokens} tokens > max_tokens {self.max_tokens}")
        if self.expect_tokens is not None:
            if tokens != self.expect_tokens or self.finish_reason != "length":
                self.fail(
                    "length_mismatch",
                    f"ignore_eos: {tokens} tokens, finish_reason={self.finish_reason!r}; "
                    f"expected {self.expect_tokens} and 'length'",
                )

    @property
    def output_tokens(self) -> int | None:
        if self.count == "logprobs":
            return self.num_tokens
        return None if self.usage is None else self.usage["completion_tokens"]


def envelope_message(body: bytes) -> str:
    """The message of an OpenAI error envelope, or the start of whatever the body is."""
    try:
        err = json.loads(body)["error"]
        return f"{err.get('type')}: {err.get('message')}"
    except (ValueError, KeyError, TypeError, AttributeError):
        return body[:120].decode("utf-8", "replace")


def streaming_payload(chat: bool, prompt, max_tokens: int, *, count: str, model: str | None):
    """The request body bench_serve, soak and locust send for a checked stream."""
    body: dict = {"stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_completion_tokens"] = body["max_tokens"] = max_tokens
        if count == "logprobs":
            body["logprobs"], body["top_logprobs"] = True, 0
    else:
        body["prompt"] = prompt
        body["max_tokens"] = max_tokens
        if count == "logprobs":
            body["logprobs"] = 0
    return body


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}, summing a name's labelled series (so a counter split
    by finish reason gives its total); histogram buckets and `_created` stamps are skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or 'le="' in line:
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{")[0]
        if name.endswith("_created"):
            continue
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return values


def metric(values: dict[str, float], suffix: str) -> float | None:
    """A metric by the end of its name, whatever the prefix (vt:, vllm:) or `_total`."""
    for name, value in values.items():
        if name.endswith(suffix) or name.endswith(suffix + "_total"):
            return value
    return None
