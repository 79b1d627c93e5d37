"""Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory, bounded in number, in
bytes and in age (the oldest go first), lost when the server stops. A response is kept only when its request
said `store: true` (the API's default).

A stored response holds its whole conversation (what a later request continues), so its ancestors' text is
in it too. Deleting a response therefore deletes every stored response that continues it: after a DELETE no
request can read the deleted text back (a continuation of a deleted response's child is a 404, as the
response itself is)."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass

RESPONSES_KEPT = 1024
RESPONSES_BYTES = 64 << 20  # the stored responses' bodies and conversations, as JSON, together at most
RESPONSE_LIFETIME_SECONDS = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the response object, as it was returned
    messages: tuple[dict, ...]  # the conversation through this response's output, as chat messages
    stored_at: float
    ancestors: tuple[str, ...] = ()  # the responses it continues, nearest first
    size: int = 0  # bytes of its body and conversation as JSON


class ResponseStore:
    """Used from the event loop only (the routes): no lock."""

    def __init__(self, capacity: int = RESPONSES_KEPT, lifetime: float = RESPONSE_LIFETIME_SECONDS,
                 budget_bytes: int = RESPONSES_BYTES):
        self.capacity, self.lifetime, self.budget_bytes = capacity, lifetime, budget_bytes
        self.kept: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def put(self, body: dict, messages: list[dict]) -> None:
        """Keep a response (one larger than the whole budget is not kept: a later request naming it gets a
        404, as for any response no longer here)."""
        size = len(json.dumps(body, ensure_ascii=False)) + len(json.dumps(messages, ensure_ascii=False))
        if size > self.budget_bytes:
            return
        parent_id = body.get("previous_response_id")
        parent = self.kept.get(parent_id) if parent_id else None
        ancestors = (parent_id, *(parent.ancestors if parent else ())) if parent_id else ()
        self._drop(body["id"])
        self.kept[body["id"]] = StoredResponse(body, tuple(messages), time.monotonic(), ancestors, size)
        self.bytes += size
        while len(self.kept) > self.capacity or self.bytes > self.budget_bytes:
            self._drop(next(iter(self.kept)))

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self.kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response and every stored response continuing it; whether anything held its text."""
        doomed = [key for key, entry in self.kept.items() if key == response_id or response_id in entry.ancestors]
        for key in doomed:
            self._drop(key)
        return bool(doomed)

    def _drop(self, response_id: str) -> None:
        entry = self.kept.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size

    def _expire(self) -> None:
        oldest = time.monotonic() - self.lifetime
        while self.kept and next(iter(self.kept.values())).stored_at < oldest:
            self._drop(next(iter(self.kept)))
