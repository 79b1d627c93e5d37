"""llama-server's own routes: POST /completion, /tokenize, /detokenize, /apply-template and GET /props, as
llama.cpp's tools and scripts call them (bodies and replies: llama_server.py). Generation goes through the
same request, scheduler and stream as the OpenAI routes."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError
from starlette.concurrency import run_in_threadpool

from specdec.errors import SpecdecError
from specdec.server.http_errors import ERROR_RESPONSES, read_body, refused
from specdec.server.jobs import run_jobs
from specdec.server.llama_server import (ApplyTemplateBody, CompletionBody, DetokenizeBody, LlamaReply,
                                         TokenizeBody, llama_limit, llama_nothing)
from specdec.server.protocol import openapi_body
from specdec.server.request_body import BadRequest, parse_request
from specdec.server.state import ServerState, server_state

router = APIRouter()
PIECES_AT_ONCE = 256  # tokens spelled between two yields of the interpreter to the generations


async def parsed(request: Request, state: ServerState, kind: type):
    return parse_request(await read_body(request, state.settings.max_request_bytes), kind)


@router.post("/completion", openapi_extra=openapi_body(CompletionBody), responses=ERROR_RESPONSES)
async def completion(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = await parsed(request, state, CompletionBody)
        state = await state.for_model(body.model)
        reply = LlamaReply(state.settings.model_name, state.token_text)
        # compiling a grammar may take seconds: off the event loop
        generation_request = await run_in_threadpool(body.generation_request, body.prompt, llama_limit(state, body))
        await run_in_threadpool(state.check_grammar, generation_request)  # a grammar that cannot start: a 400
        if body.n_predict == 0:  # llama-server reads the prompt and generates nothing
            ids = await run_in_threadpool(state.generator.prompt_ids, generation_request)
            return llama_nothing(reply, len(ids), body.stream)
    except SpecdecError as exc:
        return refused(exc)
    return await run_jobs(state, request, generation_request, 1, body.stream, reply)


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeBody), responses=ERROR_RESPONSES)
async def tokenize(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = await parsed(request, state, TokenizeBody)
        tokenizer = state.generator.target.tokenizer
        text = text_checked(body.content)
    except SpecdecError as exc:
        return refused(exc)

    def tokens() -> bytes:  # a megabyte of text takes a second to tokenize and spell: off the event loop
        ids = tokenizer.encode(text, add_special_tokens=body.add_special)
        if not body.with_pieces:
            return json.dumps({"tokens": ids}).encode()
        found = []
        for start in range(0, len(ids), PIECES_AT_ONCE):
            found += [{"id": token, "piece": piece(tokenizer, token)} for token in ids[start:start + PIECES_AT_ONCE]]
            time.sleep(0)  # spelling is Python: let the generations' rounds have the interpreter between blocks
        return json.dumps({"tokens": found}, ensure_ascii=False).encode()

    # Tokenizing holds the interpreter's lock much of the time: several at once would starve the generations'
    # rounds of it, so tokenize requests take turns (one at a time beside the generations).
    async with state.tokenizing:
        content = await run_in_threadpool(tokens)
    return Response(content, media_type="application/json")


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeBody), responses=ERROR_RESPONSES)
async def detokenize(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = await parsed(request, state, DetokenizeBody)
        vocab = state.generator.target.model.vocab_size
        if any(not 0 <= token < vocab for token in body.tokens):
            raise BadRequest(f"tokens must be ids in [0, {vocab})", "tokens")
    except SpecdecError as exc:
        return refused(exc)
    return JSONResponse({"content": state.generator.target.tokenizer.decode(body.tokens, skip_special_tokens=False)})


@router.post("/apply-template", openapi_extra=openapi_body(ApplyTemplateBody), responses=ERROR_RESPONSES)
async def apply_template(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = await parsed(request, state, ApplyTemplateBody)
        target = state.generator.target
        if not target.has_chat_template:
            raise BadRequest(f"model {state.settings.model_name!r} has no chat template", "messages")
        messages = [message.for_template() for message in body.messages]
        for message in messages:
            text_checked(message.get("content") or "")
        tools = {"tools": [tool.model_dump(exclude_none=True) for tool in body.tools]} if body.tools else {}
        try:
            prompt = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                          **tools)
        except TemplateError as error:
            raise BadRequest(f"the chat template cannot render these messages ({str(error).splitlines()[0]})",
                             "messages") from None
    except SpecdecError as exc:
        return refused(exc)
    return JSONResponse({"prompt": prompt})


@router.get("/props")
async def props(state: ServerState = Depends(server_state)) -> Response:
    """What llama-server's /props says of itself that a client reads: the context, the slots, the chat
    template, the default generation settings; and which drafter speculates."""
    target, generator = state.generator.target, state.generator
    return JSONResponse({
        "model_alias": state.settings.model_name, "model_path": str(target.path),
        "total_slots": state.settings.max_active, "chat_template": getattr(target.tokenizer, "chat_template", None),
        "default_generation_settings": {"n_ctx": target.model.max_context,
                                        "params": {"n_predict": state.default_max_tokens, "temperature": 0.0}},
        "build_info": "specdec", "speculative": {"drafter": generator.engine.drafter_name},
    })


def text_checked(text: str) -> str:
    """Text a tokenizer can take (BadRequest for a lone surrogate, as every other route refuses it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the text is not valid Unicode (it holds a lone surrogate)") from None
    return text


def piece(tokenizer, token: int) -> str:
    """A token's text (a byte-level token that is part of a character decodes to U+FFFD)."""
    return tokenizer.decode([token], skip_special_tokens=False)
