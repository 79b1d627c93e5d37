"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API (what Codex CLI and the
Agents SDK speak), run as the chat request it means; `previous_response_id` continues a stored response's
conversation (response_store.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from specdec.errors import SpecdecError
from specdec.server.http_errors import ERROR_RESPONSES, error, read_body, refused
from specdec.server.jobs import run_jobs
from specdec.server.protocol import openapi_body
from specdec.server.request_body import parse_request
from specdec.server.responses_api import ResponsesRequest
from specdec.server.responses_reply import ResponsesReply
from specdec.server.routes_completions import make_request
from specdec.server.state import ServerState, server_state

router = APIRouter()


@router.post("/v1/responses", openapi_extra=openapi_body(ResponsesRequest), responses=ERROR_RESPONSES)
async def create_response(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), ResponsesRequest)
    except SpecdecError as exc:
        return refused(exc)
    history: tuple[dict, ...] = ()
    if body.previous_response_id is not None:
        previous = state.responses.get(body.previous_response_id)
        if previous is None:
            return not_found(body.previous_response_id, "previous_response_id")
        history = previous.messages
    try:
        chat = body.chat_request(history)
        state = await state.for_model(chat.model)
        generation_request = await run_in_threadpool(make_request, state, chat)
    except SpecdecError as exc:
        return refused(exc)
    reply = ResponsesReply(state.settings.model_name, body, chat.tool_definitions() if chat.uses_tools else (),
                           state.reasoning, state.responses, history)
    return await run_jobs(state, request, generation_request, 1, body.stream, reply)


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def get_response(response_id: str, state: ServerState = Depends(server_state)) -> Response:
    stored = state.responses.get(response_id)
    return JSONResponse(stored.body) if stored is not None else not_found(response_id)


@router.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, state: ServerState = Depends(server_state)) -> Response:
    if not state.responses.delete(response_id):
        return not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def not_found(response_id: str, param: str | None = None) -> JSONResponse:
    return error(404, f"no response with id {response_id!r} is stored here (responses are kept in memory, "
                      "for a while, when stored)", "invalid_request_error", param)
