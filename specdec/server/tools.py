"""Tool calls in the Hermes format (Qwen2.5, Qwen3, Hermes and the many templates that copied it): the chat
template lists the tools, and the model answers a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(several in a row for parallel calls). Here: whether a model's template speaks it, the grammar that makes
`tool_choice` "required" or a named function certain (the calls' JSON checked against each function's
parameter schema, by the same exact constrained decoding as any schema), and parsing the text back into
OpenAI's `tool_calls`, whole or as a stream.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Sequence

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError

from specdec.api.structured import GrammarSpec, check_startable, with_json_options
from specdec.errors import InvalidParameterError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def speaks_hermes(tokenizer) -> bool:
    """Whether the tokenizer's chat template lists tools and expects Hermes-style calls."""
    return template_speaks_hermes(getattr(tokenizer, "chat_template", None) or "")


def template_speaks_hermes(template: str) -> bool:
    return OPEN in template and "tools" in template


def check_tool_parameters(tools: list[dict], tokenizer, vocab_size: int) -> None:
    """Each function's parameter schema refused (InvalidParameterError naming the tool) exactly where the
    same schema as a response format would be: bounds, keywords, the compiler, an output that cannot start
    (a $ref cycle with no base case). Inside the call grammar such a schema would fail only once the model
    wrote a call, mid-output. Schemas already checked are remembered."""
    for index, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters")
        if parameters is None:
            continue
        kind = _top_type(parameters)
        if kind not in (None, "object", ["object"]):
            raise InvalidParameterError(f"tools[{index}] ({function['name']}): parameters must describe a JSON object "
                                        f"(\"type\": \"object\"), as a call's arguments are one, not {json.dumps(kind)}")
        key = (json.dumps(parameters, sort_keys=True), id(tokenizer), vocab_size)
        if key in _checked_parameters:
            continue
        try:
            check_startable(GrammarSpec("json_schema", parameters), tokenizer, vocab_size)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"tools[{index}] ({function['name']}): parameters: {error}") from None
        if len(_checked_parameters) >= CHECKED_PARAMETERS_KEPT:
            _checked_parameters.clear()
        _checked_parameters.add(key)


def _top_type(parameters: dict):
    """The type a parameter schema gives its value at the top: its own `type`, or that of the local definition
    its top-level `$ref` names."""
    reference = parameters.get("$ref")
    if "type" not in parameters and isinstance(reference, str) and reference.startswith("#/"):
        node = parameters
        for part in reference[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        return node.get("type") if isinstance(node, dict) else None
    return parameters.get("type")


CHECKED_PARAMETERS_KEPT = 1024  # an agent sends the same tools every turn: their check is paid once
_checked_parameters: set[tuple] = set()


def tool_names(tools: list[dict]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def call_grammar(tools: list[dict], only: str | None, tokenizer, parallel: bool = True) -> GrammarSpec:
    """The grammar of one or more calls (one where `parallel` is off), each of a listed function (`only`:
    of that one) with arguments its parameter schema allows."""
    return GrammarSpec("lark", f"start: call{'+' if parallel else ''}\n" + _call_rule(tools, only, tokenizer))


# An answer in text must not open as a tool call spelled some other way: bare JSON, or a ```json / ```{ fence
# (small models write these instead of their template's <tool_call>, and no client reads them as calls).
# Whitespace first, then any first character but "{" and "`", or a backtick run that does not open such a
# fence; the rest is free. The call marker itself is a special token, which this text can never spell.
ANSWER_TEXT = r"[ \t\r\n]*([^{` \t\r\n]|`[^`]|``[^`]|```[^j\n{]|```j[^s]|```js[^o]|```jso[^n]|```\n[^{])[\s\S]*"


def auto_grammar(tools: list[dict], tokenizer, parallel: bool = True) -> GrammarSpec:
    """`tool_choice: "auto"`: text, then calls in the template's format (any number, or one where
    `parallel` is off) whose arguments match their function's schema. Text alone, calls alone, or text
    then calls."""
    calls = "call*" if parallel else "call?"
    return GrammarSpec("lark", f"start: TEXT? {calls}\nTEXT: /{ANSWER_TEXT}/\n" + _call_rule(tools, None, tokenizer))


def _call_rule(tools: list[dict], only: str | None, tokenizer) -> str:
    """The Lark rule `call`: one call of a listed function (`only`: of that one). The markers are written as
    the tokenizer's own added tokens where it has them (a grammar then matches those tokens, not their
    spelled-out text)."""
    chosen = [tool["function"] for tool in tools if only is None or tool["function"]["name"] == only]
    if not chosen:
        raise InvalidParameterError(f"tool_choice names {only!r}, which is not among the tools")
    definitions: dict = {}
    calls = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                               "arguments": hoisted(as_object(function.get("parameters")),
                                                                    f"{index}_", definitions)},
              "required": ["name", "arguments"], "additionalProperties": False}
             for index, function in enumerate(chosen)]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = with_json_options({**schema, "$defs": definitions} if definitions else schema)
    vocabulary = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    opening = OPEN if OPEN in vocabulary else json.dumps(OPEN)
    closing = CLOSE if CLOSE in vocabulary else json.dumps(CLOSE)
    return f"call: {opening} \"\\n\" %json {json.dumps(schema)} \"\\n\" {closing} \"\\n\"?\n"


def as_object(parameters: dict | None) -> dict:
    """A parameter schema whose value is an object whatever it left open: a schema without a type (`{}`, an
    `anyOf` of several) is held to objects, as the APIs define a call's arguments."""
    if not parameters:
        return {"type": "object"}
    return parameters if "type" in parameters or "$ref" in parameters else {**parameters, "type": "object"}


def hoisted(parameters: dict, prefix: str, definitions: dict) -> dict:
    """A function's parameter schema for use inside the call grammar's schema: its local definitions
    ("$defs", or the older "definitions", what nested pydantic models produce) move to the root's "$defs"
    under names given `prefix` (functions may reuse a name), and its "#/..." references follow them."""
    own = {key: parameters[key] for key in ("$defs", "definitions") if isinstance(parameters.get(key), dict)}
    renamed = {f"#/{key}/{name}": f"#/$defs/{prefix}{name}" for key, table in own.items() for name in table}

    def rewrite(node):
        if isinstance(node, dict):
            reference = node.get("$ref")
            out = {key: rewrite(value) for key, value in node.items() if key != "$ref"}
            if isinstance(reference, str):
                out["$ref"] = renamed.get(reference, f"#/$defs/{prefix}" if reference == "#" else reference)
            return out
        return [rewrite(item) for item in node] if isinstance(node, list) else node

    for table in own.values():
        definitions.update({f"{prefix}{name}": rewrite(schema) for name, schema in table.items()})
    body = rewrite({key: value for key, value in parameters.items() if key not in own})
    if any(reference == "#" for reference in _references(parameters)):  # the whole schema refers to itself
        definitions[prefix] = body
    return body


def _references(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_calls(text: str, tools: Sequence[dict] = ()) -> tuple[str | None, list[ToolCall]]:
    """(the text outside the calls, or None when there is none; the calls). A call whose JSON does not read
    as {"name": ..., "arguments": ...} stays in the text; an unfinished one at the end (max_tokens ran out
    inside it) is neither a call nor content: it is dropped. A reply with no marked call that is one call of
    a declared tool written as text (`written_call`) is that call."""
    text = without_unfinished_call(text)
    written = written_call(text, tools) if tools and OPEN not in text else None
    if written is not None:
        return None, [written]
    calls, kept, position = [], [], 0
    for match in _CALL.finditer(text):
        call = _read_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None) if calls else (text or None), calls


# One code fence of any language tag around the whole reply: ```javascript\n{...}\n```
_FENCE = re.compile(r"\A```[^\n`]*\n(.*?)\s*```\Z", re.S)


def written_call(text: str, tools: Sequence[dict]) -> ToolCall | None:
    """The reply read as a call its model wrote as text instead of in its template's markers (small models
    do, in a fence tagged javascript, python, plain, xml...): the whole reply, bare or in one code fence, is
    one JSON object naming a declared tool, whose arguments its parameter schema allows. Else None: the
    reply stays text."""
    body = text.strip()
    fenced = _FENCE.match(body)
    body = fenced.group(1).strip() if fenced else body
    if not body.startswith("{"):
        return None
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    declared = {tool["function"]["name"]: tool["function"] for tool in tools}
    if not isinstance(value, dict) or set(value) - {"name", "arguments", "parameters"} \
            or value.get("name") not in declared:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict) or not _allowed(arguments, declared[value["name"]].get("parameters")):
        return None
    return ToolCall(new_call_id(), value["name"], json.dumps(arguments))


def _allowed(arguments: dict, schema: dict | None) -> bool:
    if not schema:
        return True
    try:
        return validators.validator_for(schema, default=Draft202012Validator)(schema).is_valid(arguments)
    except SchemaError:
        return False


def could_be_written_call(text: str) -> bool:
    """Whether a reply that begins with `text` may still turn out to be a written call (`written_call`):
    nothing but blanks yet, a "{", or a fence whose first line is not finished or whose body opens with "{"."""
    start = text.lstrip()
    if not start or start.startswith("{"):
        return True
    if not (start.startswith("```") or "```".startswith(start)):
        return False
    newline = start.find("\n")
    body = start[newline + 1:].lstrip() if newline >= 0 else ""
    return newline < 0 or not body or body.startswith("{")


def without_unfinished_call(text: str) -> str:
    """The text without a call opened at its end and never closed."""
    start = text.rfind(OPEN)
    return text[:start] if start >= 0 and text.find(CLOSE, start) < 0 else text


def _read_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(new_call_id(), value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


class CallStream:
    """Streamed text split into content deltas and whole tool calls: text before a call streams as content;
    from `<tool_call>` on it is held until its `</tool_call>` arrives and the call is read. With `tools`, a
    reply that may still be a call written as text (`could_be_written_call`) is held until it is one (at
    its end) or cannot be."""

    def __init__(self, tools: Sequence[dict] = ()):
        self.pending = ""  # text not yet handed out: a possible call or the start of a marker
        self.calls = 0
        self.tools = tuple(tools)
        self.maybe_written = bool(self.tools)  # nothing handed out yet, and the reply may be a written call

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.maybe_written:
            self.pending += text
            if could_be_written_call(self.pending):
                return "", []
            self.maybe_written, text, self.pending = False, self.pending, ""
        self.pending += text
        content, calls = "", []
        while True:
            start = self.pending.find(OPEN)
            if start < 0:  # hold back what could still become the opening marker
                hold = next((n for n in range(min(len(OPEN) - 1, len(self.pending)), 0, -1)
                             if OPEN.startswith(self.pending[-n:])), 0)
                content += self.pending[:len(self.pending) - hold]
                self.pending = self.pending[len(self.pending) - hold:]
                return content, calls
            content += self.pending[:start]
            end = self.pending.find(CLOSE, start)
            if end < 0:
                self.pending = self.pending[start:]
                return content, calls
            call = _read_call(self.pending[start + len(OPEN):end].strip())
            if call is None:  # not a call after all: it was text
                content += self.pending[:end + len(CLOSE)]
            else:
                calls.append(call)
                self.calls += 1
            self.pending = self.pending[end + len(CLOSE):].lstrip("\n") if call else self.pending[end + len(CLOSE):]

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is still held: a written call, or content (the start of a marker that never came); an
        unfinished call is dropped, as parse_calls drops it."""
        rest, self.pending = self.pending, ""
        written = written_call(rest, self.tools) if self.maybe_written else None
        if written is not None:
            self.calls += 1
            return "", [written]
        return without_unfinished_call(rest), []
