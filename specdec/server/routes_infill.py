"""POST /infill: llama.cpp's fill-in-the-middle endpoint, as editor plugins (llama.vim, llama.vscode) call it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from specdec.api.request import GenerationRequest
from specdec.core.rounds import GenerationResult
from specdec.errors import SpecdecError
from specdec.server.http_errors import ERROR_RESPONSES, read_body, refused
from specdec.server.infill import InfillRequest, require_fim
from specdec.server.jobs import run_jobs
from specdec.server.protocol import parse_request
from specdec.server.replies import speculative_stats
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
        # as llama-server cuts n_predict to its own -n: a request never generates past the cap
        limit = min(body.n_predict, state.max_tokens_cap) if body.n_predict > 0 else state.default_max_tokens
        generation_request = GenerationRequest(prompt, limit, body.sampling(), body.checked_stop(),
                                               None if body.seed in (None, -1) else body.seed, chat=False)
    except SpecdecError as exc:
        return refused(exc)
    return await run_jobs(state, request, generation_request, 1, body.stream, InfillReply(settings.model_name),
                          infill=True)


class InfillReply:
    """llama-server's `/infill` response shape: content, stop, token counts, timings."""

    def __init__(self, model: str):
        self.model = model

    def chunk(self, text: str) -> dict:
        return {"content": text, "stop": False}

    def last(self, result: GenerationResult) -> dict:
        return {"content": "", "stop": True, **self._summary(result)}

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        return {"content": result.text, "stop": True, "tokens_evaluated": prompt_tokens, **self._summary(result)}

    def _summary(self, result: GenerationResult) -> dict:
        s = result.stats
        return {"model": self.model, "tokens_predicted": len(result.token_ids),
                "stop_type": "limit" if result.finish_reason == "length" else "eos",
                "timings": {"predicted_n": s.new_tokens, "predicted_per_second": s.decode_tokens_per_second},
                "specdec": speculative_stats(result)}
