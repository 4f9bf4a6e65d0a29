"""The OpenAI routes. Handlers decide every error before the first SSE byte.

Hot path: keep it lean, put features in helpers (validate.py, responses.py).
"""

import logging
from functools import partial

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vtllm import __version__
from vtllm.errors import InvalidParameter, VtllmError
from vtllm.models.chat_template import cut_after_final, render_chat
from vtllm.scheduler.output import ERROR
from vtllm.server import preprocess, responses
from vtllm.server.admission import DISCONNECTED_AT, admit, admit_prompt_tokens
from vtllm.server.chat_setup import ChatSetup
from vtllm.server.fields import IGNORED_HEADER, ignore_unknown, refuse_unsupported
from vtllm.server.http_errors import (
    HttpError,
    close_if_body_unread,
    error_response,
    from_exception,
)
from vtllm.server.protocol import (
    chat_decoder,
    completion_decoder,
    detokenize_decoder,
    encoder,
    tokenize_decoder,
)
from vtllm.server.sse import DONE, PING, SSEResponse, frame
from vtllm.server.structured import structured_outputs
from vtllm.server.validate import (
    chat_messages,
    check_fan_out,
    check_fits,
    completion_prompts,
    continues_final_message,
    prompt_truncation,
    sampling_params,
)

log = logging.getLogger("vtllm.server")


async def read_json(request: Request, decoder, limit: int):
    """The body as (request Struct, names of the fields in it that no API defines)."""
    content_type, *params = request.headers.get("content-type", "").lower().split(";")
    charsets = [p.split("=", 1)[1].strip(' "') for p in params if p.strip().startswith("charset=")]
    if content_type.strip() != "application/json" or any(c != "utf-8" for c in charsets):
        raise HttpError(
            415, "Content-Type must be application/json (UTF-8)", type_="invalid_request_error"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"body larger than {limit} bytes", type_="invalid_request_error")
    body = bytearray()
    # hypercorn's read timeout is per read, so a body trickled a byte at a time would hold
    # the connection for ever: the whole body gets one deadline.
    deadline = request.app.state.vt.config.server_body_timeout_s
    with anyio.move_on_after(deadline) as scope:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HttpError(
                    413, f"body larger than {limit} bytes", type_="invalid_request_error"
                )
    if scope.cancelled_caught:
        raise HttpError(
            408, f"the body did not arrive within {deadline:g}s", type_="invalid_request_error"
        )
    request.state.body_read = True
    try:
        return decoder.decode(bytes(body))
    except RecursionError:  # msgspec's depth guard on deeply nested arrays or objects
        raise HttpError(
            400,
            "the JSON body is nested too deeply",
            type_="invalid_request_error",
            code="invalid_json",
        ) from None


async def read_request(request: Request, decoder, route: str):
    """The body as a request Struct; fields no API defines are refused in strict mode, else
    named in a log line and on the response (`_named`)."""
    config = request.app.state.vt.config
    req, unknown = await read_json(request, decoder, config.max_body_bytes)
    request.state.ignored = ignore_unknown(
        unknown, strict=config.strict_request_fields, route=route
    )
    return req


def _named(request: Request, response: Response) -> Response:
    ignored = getattr(request.state, "ignored", None)
    if ignored is not None:
        response.headers[IGNORED_HEADER] = ignored
    return response


def _refusal(request: Request, exc: Exception) -> Response:
    return _named(request, close_if_body_unread(request, from_exception(exc)))


def _check_model(state, model: str | None) -> None:
    if model is not None and model != state.model_name and model not in state.model_names:
        raise HttpError(
            404,
            "the model is not served here; GET /v1/models lists it",
            type_="invalid_request_error",
            code="model_not_found",
            param="model",
        )


def _render(tok, messages, add_generation_prompt: bool, max_chars: int, **variables) -> str:
    """`variables`: tools and extra (chat_template_kwargs), as render_chat takes them."""
    text = render_chat(  # its failures, overflow and recursion included, are a typed 400
        tok.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tok.special_token(tok.bos_token_id),
        eos_token=tok.special_token(tok.eos_token_ids[0] if tok.eos_token_ids else None),
        **variables,
    )
    # A template may multiply its input; what comes out is bounded like what goes in.
    if len(text) > 2 * max_chars + 65536:
        raise InvalidParameter("the rendered chat is too long", param="messages")
    return text


async def completions(request: Request) -> Response:
    state = request.app.state.vt
    try:
        admit(state)
        req = await read_request(request, completion_decoder, "completions")
        _check_model(state, req.model)
        refuse_unsupported(req)
        cfg = state.config
        params = sampling_params(req, chat=False, max_new_tokens=cfg.server_max_new_tokens)
        params.structured_outputs = structured_outputs(req)
        params.check_vocab(state.vocab_size)
        prompts_of = partial(
            completion_prompts,
            req,
            state.tokenizer,
            state.vocab_size,
            cfg.server_max_prompt_chars,
            state.max_model_len,
        )
        # Up to a body's worth of text (MiBs) to tokenize: off the event loop when long.
        prompts = await preprocess.run(prompts_of, len(req.prompt))
        check_fan_out(len(prompts), params.n)
        admit_prompt_tokens(state, sum(len(p) for p in prompts) * params.n)
        stream = state.engine.submit(prompts, params, priority=req.priority, prefix="cmpl")
    except (VtllmError, ValueError) as exc:
        return _refusal(request, exc)
    shaper = responses.CompletionShaper(state, req, stream)
    if req.stream:
        return _named(request, _stream(state, stream, shaper, request.scope))
    return _named(request, await _gather(state, stream, shaper, request))


async def chat_completions(request: Request) -> Response:
    state = request.app.state.vt
    try:
        admit(state)
        req = await read_request(request, chat_decoder, "chat/completions")
        _check_model(state, req.model)
        refuse_unsupported(req)
        cfg = state.config
        tok, max_chars = state.tokenizer, cfg.server_max_prompt_chars
        keep = prompt_truncation(req, state.max_model_len)

        def prepare():  # one thread hop: checks, template, tokenizer
            messages = chat_messages(req, max_chars)
            cont = continues_final_message(req, messages)
            setup = ChatSetup.of(req, messages, cfg, tok.chat_template)
            text = _render(
                tok,
                setup.messages,
                req.add_generation_prompt,
                max_chars,
                tools=setup.template_tools,
                extra=setup.extra,
            )
            if cont:
                text = cut_after_final(text, messages[-1]["content"])
            setup.rendered(text)
            if keep is None:  # else any length fits once cut
                check_fits(tok, text, state.max_model_len)
            ids = tok.encode(text)
            return (ids if keep is None else ids[-keep:]), setup

        prompt, setup = await preprocess.run(prepare)
        params = sampling_params(req, chat=True, max_new_tokens=cfg.server_max_new_tokens)
        setup.constrain(req, params)
        params.check_vocab(state.vocab_size)
        admit_prompt_tokens(state, len(prompt) * params.n)
        stream = state.engine.submit([prompt], params, priority=req.priority, prefix="chatcmpl")
    except (VtllmError, ValueError) as exc:
        return _refusal(request, exc)
    shaper = responses.ChatShaper(state, req, stream, setup)
    if req.stream:
        return _named(request, _stream(state, stream, shaper, request.scope))
    return _named(request, await _gather(state, stream, shaper, request))


def _error_frame(message: str) -> bytes:
    body = {"message": message, "type": "internal_error", "param": None, "code": None}
    return frame({"error": body})


def _stream(state, stream, shaper, scope) -> SSEResponse:
    """SSE: starlette cancels this generator when the client goes away, and SSEResponse
    closes it when the client stops reading; `finally` then aborts the request in the engine,
    which frees its blocks."""

    encode = frame if state.frame_fault is None else state.frame_fault.frame

    async def events():
        try:
            for chunk in shaper.opening():
                yield encode(chunk)
            async for choice, delta in stream:
                if choice is None:
                    yield PING
                    continue
                if delta.finish_reason == ERROR:  # engine failure or shutdown deadline
                    yield _error_frame(str(delta.stop_reason or "the request failed"))
                    continue
                chunk = shaper.chunk(choice, delta)
                if chunk is not None:
                    yield encode(chunk)
            usage = shaper.usage_chunk()
            if usage is not None:
                yield encode(usage)
        except Exception:  # after headers: one well-formed error frame, then [DONE]
            log.exception("stream %s failed", stream.id)
            yield _error_frame("internal error while streaming")
        finally:
            stream.abort(scope.get(DISCONNECTED_AT, 0.0))
        yield DONE

    observer = state.engine.observer
    on_stall = None if observer is None else observer.on_write_stall
    config = state.config
    return SSEResponse(
        events(),
        stall_timeout_s=config.server_write_stall_timeout_s,
        on_stall=on_stall,
        idle_s=config.server_sse_ping_s,
        on_idle=stream.poke,
    )


async def _gather(state, stream, shaper, request: Request) -> Response:
    """Waits for every choice, racing a disconnect watcher that aborts the request."""

    async def watch_disconnect(scope):
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_disconnect, tg.cancel_scope)
        try:
            async for _choice, _delta in stream:
                pass
        finally:
            stream.abort(request.scope.get(DISCONNECTED_AT, 0.0))
        tg.cancel_scope.cancel()
    failed = [c for c in stream.choices if c.total.finish_reason == ERROR]
    if failed:
        message = str(failed[0].total.stop_reason or "the request failed")
        # Draining past the deadline is 503 (try another replica); a failed engine is 500.
        status = 503 if state.status == "draining" else 500
        return error_response(status, message, "internal_error")
    return Response(encoder.encode(shaper.final()), media_type="application/json")


async def models(request: Request) -> Response:
    state = request.app.state.vt
    cards = [
        {
            "id": name,
            "object": "model",
            "created": state.started,
            "owned_by": "vtllm",
            "max_model_len": state.max_model_len,
        }
        for name in state.model_names or (state.model_name,)
    ]
    embedder = state.engine.embedder
    if embedder is not None:
        cards.append(
            {
                "id": embedder.name,
                "object": "model",
                "created": state.started,
                "owned_by": "vtllm",
                "max_model_len": embedder.max_model_len,
            }
        )
    return JSONResponse({"object": "list", "data": cards})


async def health(request: Request) -> Response:
    state = request.app.state.vt
    return Response(status_code=200 if state.status == "ok" else 503)


async def version(_request: Request) -> Response:
    return JSONResponse({"version": __version__})


def _chat_ids(state, req) -> list[int]:
    """/tokenize's messages through the chat template, as the chat route renders them."""
    tok, max_chars = state.tokenizer, state.config.server_max_prompt_chars
    messages = chat_messages(req, max_chars)
    cont = continues_final_message(req, messages)
    text = _render(tok, messages, req.add_generation_prompt, max_chars)
    if cont:
        text = cut_after_final(text, messages[-1]["content"])
    return tok.encode(text, add_special_tokens=req.add_special_tokens)


async def tokenize(request: Request) -> Response:
    state = request.app.state.vt
    try:
        req = await read_request(request, tokenize_decoder, "tokenize")
        _check_model(state, req.model)
        refuse_unsupported(req)
        if len(req.messages) and isinstance(req.prompt, str):
            raise InvalidParameter("send a prompt or messages, not both", param="messages")
        if len(req.messages):
            ids = await preprocess.run(partial(_chat_ids, state, req), len(req.messages))
        elif isinstance(req.prompt, str):
            ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            raise HttpError(
                400, "prompt or messages is required", type_="invalid_request_error", param="prompt"
            )
    except (VtllmError, ValueError) as exc:
        return _refusal(request, exc)
    body = {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}
    return _named(request, JSONResponse(body))


async def detokenize(request: Request) -> Response:
    state = request.app.state.vt
    try:
        req = await read_request(request, detokenize_decoder, "detokenize")
        _check_model(state, req.model)
        if any(t < 0 or t >= state.vocab_size for t in req.tokens):
            raise HttpError(
                400, "token ids out of range", type_="invalid_request_error", param="tokens"
            )
    except (VtllmError, ValueError) as exc:
        return _refusal(request, exc)
    return _named(request, JSONResponse({"prompt": state.tokenizer.decode(req.tokens)}))
