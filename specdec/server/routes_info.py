"""GET /health, /v1/models and /metrics: what the server is, serves and has done."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from specdec.server.metrics import ServerMetrics
from specdec.server.state import ServerState, server_state

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(server_state)):
    return {"status": "ok", "model": state.settings.model_name, "active": state.scheduler.active_count,
            "queued": state.scheduler.queue_length, "pid": os.getpid()}  # pid: which replica answered


@router.get("/v1/models")
async def models(state: ServerState = Depends(server_state)):
    loaded = set(state.models.loaded)
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "specdec", "loaded": name in loaded}
        for name in state.models.names()]}


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {ServerMetrics.content_type: {}}, "description": "Prometheus text format"}})
async def prometheus(state: ServerState = Depends(server_state)):
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
