"""An OpenAI-compatible server over HF transformers, the "HF transformers" peer for bench_serve.

    python loadtest/peers/hf_server.py --model DIR --port 8001 [--device cuda|cpu]
        [--dtype bfloat16|float32] [--max-batch 8]

Static batching: the engine thread takes up to --max-batch waiting requests, left-pads their
prompts, runs one prefill and then decode steps for the whole batch over the KV cache
(past_key_values) until every row has finished; requests that arrive meanwhile wait for the next
batch. Tokens stream per request as they are produced, one chunk per token with its logprob, so
loadtest/stream_check.py counts them exactly. Needs torch, transformers, starlette and uvicorn
(requirements-hf.txt), or hypercorn in uvicorn's place (where uvicorn is not installed); imports
nothing from vtllm.
"""

import argparse
import asyncio
import inspect
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer


class BadRequest(Exception):
    pass


@dataclass
class Job:
    ids: list[int]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue  # (token id, logprob, finish_reason | None), or an Exception
    cancelled: bool = False
    generated: list[int] = field(default_factory=list)

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Engine:
    def __init__(self, args):
        self.device = torch.device(args.device)
        dtype = getattr(torch, args.dtype)
        self.tok = AutoTokenizer.from_pretrained(args.model)
        self.model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        self.model.to(self.device).eval()
        cfg = self.model.config
        eos = self.model.generation_config.eos_token_id
        eos = cfg.eos_token_id if eos is None else eos
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.vocab = cfg.vocab_size
        self.max_len = getattr(cfg, "max_position_embeddings", None) or 1 << 30
        self.pad = self.tok.pad_token_id or 0
        # newer transformers renamed `past_key_values` to `cache`; accept either version.
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.max_batch, self.wait_s = args.max_batch, args.batch_wait_ms / 1000
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.batches = 0  # shown on /health, so a test can tell batching happened
        threading.Thread(target=self._loop, daemon=True, name="hf-engine").start()

    def _loop(self) -> None:
        while True:
            batch = [self.jobs.get()]
            deadline = time.monotonic() + self.wait_s  # a short window to gather arrivals
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.jobs.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            batch = [j for j in batch if not j.cancelled]
            try:
                if batch:
                    self.batches += 1
                    with torch.inference_mode():
                        self._run(batch)
            except Exception as exc:  # a failed batch fails its requests, not the server
                for j in batch:
                    j.put(exc)

    def _run(self, batch: list[Job]) -> None:
        width = max(len(j.ids) for j in batch)
        ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, j in enumerate(batch):  # left padding: every row's last token is at -1
            ids[row, width - len(j.ids) :] = torch.tensor(j.ids)
            mask[row, width - len(j.ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        done = [False] * len(batch)
        past = None
        while True:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,  # only the last position's logits, not [batch, width, vocab]
                **{self.cache_kw: past},
            )
            past = out["cache"] if self.cache_kw == "cache" else out.past_key_values
            logprobs = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)
            nxt = self._sample(logprobs, batch)
            chosen = logprobs.gather(1, nxt[:, None])[:, 0].tolist()
            for row, j in enumerate(batch):
                if done[row]:
                    continue
                if j.cancelled:
                    done[row] = True
                    continue
                t = int(nxt[row])
                j.generated.append(t)
                reason = None
                if t in self.eos and not j.ignore_eos:
                    reason = "stop"
                elif len(j.generated) >= j.max_tokens or len(j.ids) + len(j.generated) >= (
                    self.max_len
                ):
                    reason = "length"
                done[row] = reason is not None
                j.put((t, chosen[row], reason))
            if all(done):
                return
            # Finished rows keep decoding (their tokens are dropped): a static batch keeps its
            # shape until the last row ends.
            ids = nxt[:, None]
            mask = torch.cat([mask, mask.new_ones((len(batch), 1))], dim=1)
            pos = pos[:, -1:] + 1

    def _sample(self, logprobs: torch.Tensor, batch: list[Job]) -> torch.Tensor:
        greedy = logprobs.argmax(-1)
        temps = torch.tensor([j.temperature for j in batch], device=logprobs.device)
        if not bool((temps > 0).any()):
            return greedy
        probs = torch.softmax(logprobs / temps.clamp(min=1e-5)[:, None], dim=-1)
        sampled = torch.multinomial(probs, 1)[:, 0]
        return torch.where(temps > 0, sampled, greedy)

    def submit(self, ids: list[int], body: dict) -> Job:
        if not ids:
            raise BadRequest("the prompt is empty")
        if any(not 0 <= t < self.vocab for t in ids):
            raise BadRequest(f"prompt token ids must be in [0, {self.vocab})")
        if len(ids) >= self.max_len:
            raise BadRequest(f"the prompt has {len(ids)} tokens; the model takes {self.max_len}")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be a positive integer")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise BadRequest("temperature must be a number >= 0")
        loop = asyncio.get_running_loop()
        job = Job(
            ids, max_tokens, float(temperature), bool(body.get("ignore_eos")), loop, asyncio.Queue()
        )
        self.jobs.put(job)
        return job


class Detok:
    """Incremental detokenizer. Only a short window of ids is re-decoded per token (so a long
    output costs O(n), and tokenizers that merge spaces across tokens still decode right), and
    text is held back while it ends in a partial UTF-8 sequence (U+FFFD)."""

    def __init__(self, tok):
        self.tok, self.ids, self.start, self.read = tok, [], 0, 0

    def add(self, t: int, final: bool) -> str:
        self.ids.append(t)
        decode = lambda ids: self.tok.decode(ids, skip_special_tokens=True)  # noqa: E731
        before = decode(self.ids[self.start : self.read])
        text = decode(self.ids[self.start :])
        if text.endswith("\ufffd") and not final or len(text) <= len(before):
            return ""
        self.start, self.read = self.read, len(self.ids)
        return text[len(before) :]


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def make_app(engine: Engine, name: str) -> Starlette:
    tok = engine.tok

    def prompt_ids(body: dict, chat: bool) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("messages must be a non-empty list")
            if not tok.chat_template:
                raise BadRequest("this model's tokenizer has no chat template")
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            # a BatchEncoding in transformers 5, a plain list of ids before
            return [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return tok(prompt)["input_ids"]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        raise BadRequest("prompt must be a string or a list of token ids")

    async def models(_: Request):
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "hf-transformers"}]
        return JSONResponse({"object": "list", "data": data})

    async def health(_: Request):
        return JSONResponse({"status": "ok", "batches": engine.batches})

    async def tokenize(request: Request):
        body = await request.json()
        ids = tok(body.get("prompt", ""), add_special_tokens=body.get("add_special_tokens", True))
        return JSONResponse({"tokens": ids["input_ids"], "count": len(ids["input_ids"])})

    async def generate(request: Request, chat: bool):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            ids = prompt_ids(body, chat)
            job = engine.submit(ids, body)
        except (BadRequest, ValueError) as exc:
            return error(400, str(exc))
        except Exception as exc:  # e.g. a chat template that rejects the messages
            return error(500, f"{type(exc).__name__}: {exc}", "server_error")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        kind = "chat.completion" if chat else "text_completion"
        created, detok = int(time.time()), Detok(tok)
        lp_flag = body.get("logprobs")  # completions send 0 ("sampled token only"), chat true
        want_lp = lp_flag is not None and lp_flag is not False
        usage_stream = bool((body.get("stream_options") or {}).get("include_usage"))

        def usage() -> dict:
            n = len(job.generated)
            return {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}

        async def tokens():
            while True:
                item = await job.out.get()
                if isinstance(item, Exception):
                    raise item
                t, lp, reason = item
                yield t, lp, reason, detok.add(t, reason is not None)
                if reason is not None:
                    return

        def choice(text: str, pieces: list[str], lps: list[float], reason) -> dict:
            c: dict = {"index": 0, "finish_reason": reason}
            if chat:
                c["delta" if body.get("stream") else "message"] = {
                    "role": "assistant",
                    "content": text,
                }
                lp = [
                    {"token": p, "logprob": v, "top_logprobs": []}
                    for p, v in zip(pieces, lps, strict=True)
                ]
                c["logprobs"] = {"content": lp} if want_lp else None
            else:
                c["text"] = text
                c["logprobs"] = {"tokens": pieces, "token_logprobs": lps} if want_lp else None
            return c

        def frame(obj: dict) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        if not body.get("stream"):
            try:
                items = [item async for item in tokens()]
            except Exception as exc:
                return error(500, f"{type(exc).__name__}: {exc}", "server_error")
            text = "".join(piece for *_, piece in items)
            pieces = [tok.convert_ids_to_tokens(t) for t, *_ in items]
            lps = [lp for _, lp, *_ in items]
            return JSONResponse(
                {
                    "id": rid,
                    "object": kind,
                    "created": created,
                    "model": name,
                    "choices": [choice(text, pieces, lps, items[-1][2])],
                    "usage": usage(),
                }
            )

        async def stream():
            head = {
                "id": rid,
                "object": kind + ".chunk" if chat else kind,
                "created": created,
                "model": name,
            }
            try:
                async for t, lp, reason, piece in tokens():
                    c = choice(piece, [tok.convert_ids_to_tokens(t)], [lp], reason)
                    yield frame({**head, "choices": [c]})
                if usage_stream:
                    yield frame({**head, "choices": [], "usage": usage()})
            except asyncio.CancelledError:
                job.cancelled = True
                raise
            except Exception as exc:
                yield frame(
                    {
                        "error": {
                            "message": f"{type(exc).__name__}: {exc}",
                            "type": "server_error",
                            "code": 500,
                        }
                    }
                )
            finally:
                job.cancelled = True  # a no-op once finished; stops the row on a disconnect
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def completions(request: Request):
        return await generate(request, chat=False)

    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/health", health),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="an HF checkpoint directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="default: bfloat16 on cuda, float32 on cpu",
    )
    p.add_argument("--max-batch", type=int, default=8, help="requests per static batch")
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        help="how long a batch waits for more arrivals after its first request",
    )
    p.add_argument("--served-model-name", help="the name /v1/models gives (default: --model)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.max_batch < 1:
        p.error("--max-batch must be >= 1")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args)
    app = make_app(engine, args.served_model_name or args.model)
    serve(app, args.host, args.port)


def serve(app, host: str, port: int) -> None:
    try:
        import uvicorn
    except ImportError:  # hypercorn serves the same ASGI app
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"{host}:{port}"]
        asyncio.run(hypercorn_serve(app, config))
        return
    uvicorn.run(app, host=host, port=port, log_level="warning")


if __name__ == "__main__":
    main()
