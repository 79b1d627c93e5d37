"""The one gate every request body passes, whatever its API: JSON read with bounds on what it may hold, then
validated into the route's pydantic model, with any refusal as a BadRequest (HTTP 400) of one readable line
naming the offending field."""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from specdec.errors import InvalidParameterError


class BadRequest(InvalidParameterError):
    """A request the server refuses with HTTP 400; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param



# Bounds on what a body's JSON may hold, checked as it is read: numbers no field needs and nesting no
# schema needs would otherwise reach code that is slow on them or refuses them with an exception of its own
# (int() past 4,300 digits, recursive walks of a schema).
MAX_INTEGER_DIGITS = 64
MAX_JSON_DEPTH = 64


def _bounded_integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise BadRequest(f"the body has an integer of {len(text.lstrip('-'))} digits; at most "
                         f"{MAX_INTEGER_DIGITS} are accepted")
    return int(text)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BadRequest(f"the body has a number out of range ({text[:20]})")
    return value


def _no_constant(name: str):
    raise BadRequest(f"the body is not valid JSON: {name} is not a JSON value")


def load_json(body: bytes | str):
    """Bytes -> the JSON value, or BadRequest with one readable line: syntax, integers past
    MAX_INTEGER_DIGITS, NaN/Infinity, nesting past MAX_JSON_DEPTH, and text that is not Unicode (a lone
    surrogate such as "\\ud800", which no tokenizer can encode)."""
    try:
        data = json.loads(body, parse_int=_bounded_integer, parse_float=_finite, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"the body's JSON is nested more than {MAX_JSON_DEPTH} deep") from None
    _check_values(data)
    return data


def _check_values(data) -> None:
    """Walks the value without recursion: depth and every string (keys included) checked."""
    pending = [(data, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise BadRequest(f"the body's JSON is nested more than {MAX_JSON_DEPTH} deep")
            items = node.items() if isinstance(node, dict) else ((None, value) for value in node)
            for key, value in items:
                if key is not None:
                    _check_text(key)
                pending.append((value, depth + 1))
        elif isinstance(node, str):
            _check_text(node)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("the body has text that is not valid Unicode (a lone surrogate escape such as "
                             "\\ud800)") from None


def refuse_unless_neutral(extra: dict | None, neutral: dict[str, tuple]) -> None:
    """BadRequest for a field this server does not implement sent at other than its neutral value."""
    for name, value in (extra or {}).items():
        if name in neutral and value not in neutral[name]:
            raise BadRequest(f"{name}={json.dumps(value)} is not supported by this server", name)


def parse_request(body: bytes, kind: type[BaseModel]) -> BaseModel:
    """Bytes -> a validated request, or BadRequest with one readable line."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        error = most_specific(exc.errors())
        param = ".".join(str(part) for part in error["loc"]) or None
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "is required"
        raise BadRequest(f"{param}: {message}" if param else message, param) from None


def most_specific(errors: list[dict]) -> dict:
    """The error to report of several (a value matching no member of a union gets one per member): the one
    found deepest in the value, where a value is a list or an object (its `str` alternative's complaint
    says less than what was wrong inside it)."""
    return max(errors, key=lambda error: len([part for part in error["loc"] if part not in ("str", "int")]))
