"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (what Claude Code and the
anthropic SDK speak), run as the chat request it means; errors in Anthropic's shape (dialect_errors.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from specdec.errors import SpecdecError
from specdec.server.anthropic_messages import MessagesInput, MessagesRequest
from specdec.server.anthropic_reply import AnthropicReply
from specdec.server.http_errors import ERROR_RESPONSES, read_body, refused
from specdec.server.jobs import run_jobs
from specdec.server.protocol import openapi_body
from specdec.server.request_body import parse_request
from specdec.server.routes_completions import make_request
from specdec.server.state import ServerState, server_state

router = APIRouter()


@router.post("/v1/messages", openapi_extra=openapi_body(MessagesRequest), responses=ERROR_RESPONSES)
async def messages(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), MessagesRequest)
        chat = body.chat_request()
        state = await state.for_model(chat.model)
        generation_request = await run_in_threadpool(make_request, state, chat)
    except SpecdecError as exc:
        return refused(exc)
    tokenizer = state.generator.target.tokenizer
    reply = AnthropicReply(state.settings.model_name, chat.tool_definitions() if chat.uses_tools else (),
                           state.reasoning, tuple(chat.stop or ()), tokenizer.decode)
    return await run_jobs(state, request, generation_request, 1, body.stream, reply)


@router.post("/v1/messages/count_tokens", openapi_extra=openapi_body(MessagesInput), responses=ERROR_RESPONSES)
async def count_tokens(request: Request, state: ServerState = Depends(server_state)) -> Response:
    """The prompt's length in tokens, as the model's chat template writes it (its tools listed)."""
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), MessagesInput)
        chat = body.chat_request(max_tokens=1)
        state = await state.for_model(chat.model)
        generation_request = await run_in_threadpool(make_request, state, chat)
        ids = await run_in_threadpool(state.generator.prompt_ids, generation_request)
    except SpecdecError as exc:
        return refused(exc)
    return JSONResponse({"input_tokens": len(ids)})
