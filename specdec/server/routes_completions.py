"""POST /v1/chat/completions and /v1/completions: OpenAI's two generation endpoints."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from specdec.api.request import GenerationRequest
from specdec.errors import SpecdecError
from specdec.server.http_errors import ERROR_RESPONSES, read_body, refused
from specdec.server.infill import require_fim
from specdec.server.jobs import run_jobs
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest, openapi_body
from specdec.server.request_body import BadRequest, parse_request
from specdec.server.replies import Reply
from specdec.server.state import ServerState, server_state
from specdec.server.tools import check_tool_parameters, speaks_hermes

router = APIRouter()


# The bodies are parsed by parse_request (one-line 400s), so their schemas are declared for the OpenAPI
# document here rather than taken from the signature.
@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest), responses=ERROR_RESPONSES)
async def chat_completions(request: Request, state: ServerState = Depends(server_state)) -> Response:
    return await complete(state, request, ChatCompletionRequest)


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest), responses=ERROR_RESPONSES)
async def completions(request: Request, state: ServerState = Depends(server_state)) -> Response:
    return await complete(state, request, CompletionRequest)


async def complete(state: ServerState, request: Request, kind: type) -> Response:
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), kind)
        state = await state.for_model(body.model)
        generation_request = await run_in_threadpool(make_request, state, body)
    except SpecdecError as exc:
        return refused(exc)
    tools = body.tool_definitions() if isinstance(body, ChatCompletionRequest) and body.uses_tools else ()
    reply = Reply(kind is ChatCompletionRequest, state.settings.model_name, body.include_usage, state.token_text,
                  tools=tools, choices=body.n, reasoning=state.reasoning, timings=body.timings_per_token,
                  speculation=body.include_speculation)
    return await run_jobs(state, request, generation_request, body.n, body.stream, reply)


def make_request(state: ServerState, body) -> GenerationRequest:
    """The generation a parsed body asks for (BadRequest naming the field at fault). Its grammars compile here
    (a schema of hundreds of definitions takes seconds): the routes call it off the event loop, so one
    request's compile never holds the others' streams."""
    settings = state.settings  # the model's the body names (ServerState.for_model)
    tokenizer = state.generator.target.tokenizer
    if isinstance(body, ChatCompletionRequest) and body.uses_tools and not speaks_hermes(tokenizer):
        raise BadRequest(f"model {settings.model_name!r}: its chat template does not list tools "
                         "(Hermes-style <tool_call> templates are supported)", "tools")
    if isinstance(body, ChatCompletionRequest) and body.uses_tools:
        try:
            check_tool_parameters(list(body.tool_definitions()), tokenizer, state.generator.target.model.vocab_size)
        except SpecdecError as exc:
            raise BadRequest(str(exc), "tools") from None
    if body.token_limit is not None and body.token_limit > state.max_tokens_cap:
        raise BadRequest(f"max_tokens is {body.token_limit}; this server generates at most {state.max_tokens_cap} "
                         "tokens a request", "max_tokens")
    try:
        request = body.generation_request(state.default_max_tokens, tokenizer, settings.tool_grammar)
    except SpecdecError as exc:
        raise BadRequest(str(exc), getattr(exc, "param", None)) from None
    if not request.tools:  # the output format's grammar (tools' schemas were checked above)
        try:
            state.check_grammar(request)
        except SpecdecError as exc:
            raise BadRequest(str(exc), "response_format") from None
    if isinstance(body, CompletionRequest) and body.suffix is not None:
        if not isinstance(body.prompt, str):
            raise BadRequest("suffix needs a text prompt", "suffix")
        fim = require_fim(tokenizer, settings.model_name, "suffix")
        request = request.replace(prompt=fim.prompt(body.prompt, body.suffix), chat=False)
    return request
