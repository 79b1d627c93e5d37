"""Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory, bounded in number and
in age (the oldest go first), lost when the server stops. A response is kept only when its request said
`store: true` (the API's default)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

RESPONSES_KEPT = 1024
RESPONSE_LIFETIME_SECONDS = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the response object, as it was returned
    messages: tuple[dict, ...]  # the conversation through this response's output, as chat messages
    stored_at: float


class ResponseStore:
    """Used from the event loop only (the routes): no lock."""

    def __init__(self, capacity: int = RESPONSES_KEPT, lifetime: float = RESPONSE_LIFETIME_SECONDS):
        self.capacity, self.lifetime = capacity, lifetime
        self.kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, body: dict, messages: list[dict]) -> None:
        self.kept[body["id"]] = StoredResponse(body, tuple(messages), time.monotonic())
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self.kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self.kept.pop(response_id, None) is not None

    def _expire(self) -> None:
        oldest = time.monotonic() - self.lifetime
        while self.kept and next(iter(self.kept.values())).stored_at < oldest:
            self.kept.popitem(last=False)
