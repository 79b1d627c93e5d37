"""Ollama's routes: /api/chat and /api/generate run as the chat request they mean, through the same scheduler
and event stream as every API (bodies.py, reply.py); /api/tags, /api/show, /api/ps and /api/version describe
what is served (catalog.py); /api/pull pulls a zoo model with Ollama's progress lines; the routes that
manage Ollama's own store or compute embeddings answer 501, naming what specdec does instead. Errors take
Ollama's shape, `{"error": "..."}` (dialect_errors.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from specdec.api.request import GenerationRequest
from specdec.errors import SpecdecError, UnknownModelError
from specdec.server.http_errors import read_body, refused
from specdec.server.infill import require_fim
from specdec.server.jobs import run_jobs
from specdec.server.protocol import openapi_body
from specdec.server.ollama.bodies import ChatBody, GenerateBody, GenerationBody, ModelBody, in_ollamas_names
from specdec.server.ollama.catalog import ModelCard, card_for, expires_at, listed_name, served_name
from specdec.server.ollama.pull import pull_reply
from specdec.server.ollama.reply import OllamaReply, ReplyTiming, load_reply
from specdec.server.request_body import BadRequest, parse_request
from specdec.server.routes_completions import make_request
from specdec.server.state import ServerState, server_state

# The Ollama release whose API these routes follow: clients that check the server's version read it.
OLLAMA_API_VERSION = "0.33.0"
NOT_SERVED = {
    "/api/embed": "embeddings: specdec serves generative models for speculative decoding, not embedding models "
                  "(serve those with Ollama or another embedding server)",
    "/api/embeddings": "embeddings: specdec serves generative models for speculative decoding, not embedding "
                       "models (serve those with Ollama or another embedding server)",
    "/api/create": "specdec does not build models from Modelfiles: serve a GGUF file or model directory by path "
                   "(specdec serve --target FILE), or a folder of them with --models-dir",
    "/api/copy": "specdec does not copy models: Ollama's store is read as it is (ollama cp manages it)",
    "/api/delete": "specdec does not delete models: Ollama's store is read as it is (ollama rm manages it)",
    "/api/push": "specdec does not push models to a registry",
    "/api/blobs/{digest}": "specdec does not take model blobs: serve a GGUF file by path (specdec serve --target "
                           "FILE)",
}

router = APIRouter()


@dataclass(frozen=True)
class Opened:
    """A generation request read: its body, its model's state and served name, and its timing so far."""

    body: GenerationBody
    model: ServerState
    served: str
    timing: ReplyTiming


async def opened(request: Request, state: ServerState, kind: type[GenerationBody]) -> Opened:
    """The body read and checked, its model loaded (SpecdecError: the refusal)."""
    arrived = time.perf_counter()
    body = parse_request(await read_body(request, state.settings.max_request_bytes), kind)
    served = served_name(body.model, state.models.names())
    model = await state.for_model(served)
    if body.thinks and model.reasoning is None:
        raise BadRequest(f"think: model {body.model!r} does not think (its chat template writes no reasoning "
                         "block)", "think")
    return Opened(body, model, served, ReplyTiming(arrived, time.perf_counter() - arrived))


@router.post("/api/chat", openapi_extra=openapi_body(ChatBody))
async def chat(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        it = await opened(request, state, ChatBody)
        body, model = it.body, it.model
        if not body.messages:
            return await preload(state, it, "chat")
        chat_request = body.chat_request([message.chat_message() for message in body.messages],
                                         model.max_tokens_cap, body.tools)
        generation_request = await ollama_request(model, chat_request)
    except SpecdecError as exc:
        return refused(exc)
    tools = chat_request.tool_definitions() if chat_request.uses_tools else ()
    reply = OllamaReply("chat", body.model, it.timing, model.token_text, tools, model.reasoning)
    state.models.keep_alive(it.served, body.keep_alive_seconds)
    return await run_jobs(model, request, generation_request, 1, body.stream, reply)


@router.post("/api/generate", openapi_extra=openapi_body(GenerateBody))
async def generate(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        it = await opened(request, state, GenerateBody)
        body, model = it.body, it.model
        if not body.prompt and body.suffix is None:
            return await preload(state, it, "generate")
        generation_request = await ollama_request(model, body.chat_request([{"role": "user", "content": body.prompt}],
                                                                     model.max_tokens_cap))
        prompt, prompt_ids = await generate_prompt(model, body)
        generation_request = generation_request.replace(prompt=prompt, chat=False)
    except SpecdecError as exc:
        return refused(exc)
    reply = OllamaReply("generate", body.model, it.timing, model.token_text, (), model.reasoning, prompt_ids)
    state.models.keep_alive(it.served, body.keep_alive_seconds)
    return await run_jobs(model, request, generation_request, 1, body.stream, reply)


async def ollama_request(model: ServerState, chat_request) -> GenerationRequest:
    """The chat request's generation, its grammars compiled off the event loop (make_request)."""
    try:
        return await run_in_threadpool(make_request, model, chat_request)
    except BadRequest as error:
        raise in_ollamas_names(error) from None


async def generate_prompt(model: ServerState, body: GenerateBody) -> tuple[str | list[int], list[int] | None]:
    """(what the model continues, its token ids where the reply returns them as `context`): the prompt as
    it is (raw), between a prefix and a suffix (the model's fill-in-the-middle format), or rendered by the
    chat template with the system message, after the earlier conversation's `context`."""
    target = model.generator.target
    if body.suffix is not None:
        fim = require_fim(target.tokenizer, model.settings.model_name, "suffix")
        return fim.prompt(body.prompt, body.suffix), None
    if body.raw:
        return body.prompt, None
    if not target.has_chat_template:
        if body.system:
            raise BadRequest(f"system: model {model.settings.model_name!r} has no chat template to place a "
                             "system message in (write it into the prompt)", "system")
        ids = await run_in_threadpool(model.generator.encode, body.prompt, False)
    else:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + \
            [{"role": "user", "content": body.prompt}]
        ids = await run_in_threadpool(model.generator.encode, messages, True)
    prompt_ids = [*(body.context or []), *ids]
    return prompt_ids, prompt_ids


async def preload(state: ServerState, it: Opened, kind: str) -> Response:
    """Nothing to generate: the model is loaded now (done), or with keep_alive 0 unloaded (Ollama's way)."""
    state.models.keep_alive(it.served, it.body.keep_alive_seconds)
    unloaded = it.served in await state.models.sweep()
    return JSONResponse(load_reply(kind, it.body.model, "unload" if unloaded else "load", it.timing))


# -- what is served --------------------------------------------------------------------------------
def location_of(state: ServerState, served: str):
    """A served model's GGUF file or directory (None where it cannot be found without pulling)."""
    from specdec.models.sources.loading import model_location

    models = state.models
    if served in models.loaded:
        return models.loaded[served].generator.target.path
    try:
        return model_location(models.catalog.models[served])
    except UnknownModelError:
        return None


def card_of(state: ServerState, served: str) -> ModelCard | None:
    location = location_of(state, served)
    try:
        return None if location is None else card_for(location)
    except (SpecdecError, OSError, ValueError, KeyError):
        return None  # a file that cannot be read is left out of the listing, not an error for every client


@router.get("/api/tags")
@router.head("/api/tags", include_in_schema=False)
async def tags(state: ServerState = Depends(server_state)) -> Response:
    def listing() -> list[dict]:
        cards = [(served, card_of(state, served)) for served in state.models.names()]
        return [card.listing(listed_name(served)) for served, card in cards if card is not None]

    return JSONResponse({"models": await run_in_threadpool(listing)})


@router.post("/api/show", openapi_extra=openapi_body(ModelBody))
async def show(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), ModelBody)
        served = served_name(body.model_name, state.models.names())
        card = await run_in_threadpool(card_of, state, served)
        if card is None:
            raise UnknownModelError(f"model {body.model_name!r}: its file cannot be read")
    except SpecdecError as exc:
        return refused(exc)
    info = card.model_info if body.verbose else {key: value for key, value in card.model_info.items()
                                                 if not isinstance(value, list) or len(value) <= 64}
    return JSONResponse({"modelfile": f"# Modelfile of a model specdec serves\nFROM {card.path}\n",
                         "parameters": "", "template": card.template, "details": card.details, "model_info": info,
                         "capabilities": list(card.capabilities), "modified_at": card.modified_at,
                         "license": card.license})


@router.get("/api/ps")
async def running(state: ServerState = Depends(server_state)) -> Response:
    def listing() -> list[dict]:
        out = []
        for served, loaded in list(state.models.loaded.items()):
            card = card_of(state, served)
            if card is None:
                continue
            on_device = loaded.generator.target.model.device.type != "cpu"
            out.append(card.listing(listed_name(served)) | {
                "expires_at": expires_at(state.models.expires(served)), "size_vram": card.size if on_device else 0,
                "context_length": loaded.generator.target.model.max_context})
        return out

    return JSONResponse({"models": await run_in_threadpool(listing)})


@router.get("/api/version")
@router.head("/api/version", include_in_schema=False)
async def version() -> Response:
    from specdec import __version__

    return JSONResponse({"version": OLLAMA_API_VERSION, "specdec": __version__})


@router.post("/api/pull", openapi_extra=openapi_body(ModelBody))
async def pull(request: Request, state: ServerState = Depends(server_state)) -> Response:
    try:
        body = parse_request(await read_body(request, state.settings.max_request_bytes), ModelBody)
    except SpecdecError as exc:
        return refused(exc)
    return await pull_reply(state, body)


def not_served(path: str):
    async def answer() -> Response:
        return JSONResponse({"error": NOT_SERVED[path]}, status_code=501)
    return answer


for _path in NOT_SERVED:
    router.add_api_route(_path, not_served(_path), methods=["POST", "HEAD", "DELETE"] if "blobs" in _path else
                         (["DELETE"] if _path == "/api/delete" else ["POST"]), include_in_schema=False)
