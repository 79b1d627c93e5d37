"""POST /infill: llama.cpp's fill-in-the-middle endpoint, as editor plugins (llama.vim, llama.vscode) call it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from specdec.errors import SpecdecError
from specdec.server.http_errors import ERROR_RESPONSES, read_body, refused
from specdec.server.infill import InfillRequest, require_fim
from specdec.server.llama_server import LlamaReply, llama_limit, llama_nothing
from specdec.server.jobs import run_jobs
from specdec.server.request_body import parse_request
from specdec.server.state import ServerState, server_state

router = APIRouter()


@router.post("/infill", responses=ERROR_RESPONSES)
async def infill(request: Request, state: ServerState = Depends(server_state)) -> Response:
    settings = state.settings
    try:
        body = parse_request(await read_body(request, settings.max_request_bytes), InfillRequest)
        fim = require_fim(state.generator.target.tokenizer, settings.model_name, "input_prefix")
        prompt = fim.prompt(body.input_prefix, body.input_suffix,
                            [(chunk.filename, chunk.text) for chunk in body.input_extra], lead=body.prompt)
        reply = LlamaReply(settings.model_name, state.token_text)
        generation_request = await run_in_threadpool(body.generation_request, prompt, llama_limit(state, body))
        await run_in_threadpool(state.check_grammar, generation_request)  # a grammar that cannot start: a 400
        if body.n_predict == 0:  # llama-server reads the prompt and generates nothing
            ids = await run_in_threadpool(state.generator.prompt_ids, generation_request)
            return llama_nothing(reply, len(ids), body.stream)
    except SpecdecError as exc:
        return refused(exc)
    return await run_jobs(state, request, generation_request, 1, body.stream, reply)
