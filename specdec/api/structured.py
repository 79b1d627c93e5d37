"""Structured outputs: a request's grammar (a JSON schema, any JSON object, a regex, a Lark or GBNF grammar)
as the constraint the round masks with (core/constraint.py), on llguidance.

Why llguidance: it computes the allowed-token set of a 152k-token vocabulary in ~0.2 ms a row on this CPU
(median over a JSON schema's answer; xgrammar 0.2.8 was faster still, ~0.01 ms, but requires triton and
apache-tvm-ffi, GPU-sized dependencies for a CPU user), its matcher rolls back, which verifying drafts needs,
and it reads JSON Schema, regexes, Lark and llama.cpp's GBNF. Its view of a tokenizer costs seconds to
build (every token's bytes in a trie): built once per tokenizer and kept.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from specdec.api.grammar_bounds import MAX_COMPILE_SECONDS, check_grammar_bounds, on_deep_stack
from specdec.core.constraint import Constraint
from specdec.errors import InvalidParameterError

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")
# Whitespace a JSON output may put between its tokens: enough for pretty-printing (a newline and an
# indentation several levels deep), bounded so that no model can fill its whole answer with blanks (a weak
# or unlucky one does, under llguidance's unbounded default). A schema's own "x-guidance" options win.
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,24}"}
# Tokens a new constraint walks ahead before it is used: llguidance builds its lexer lazily, so a grammar it
# cannot handle (a regex repeated a million times) fails a token or two in, not when compiled.
PROBE_TOKENS = 4


def with_json_options(schema: dict) -> dict:
    """The schema with JSON_OPTIONS as its "x-guidance" defaults, unless it sets its own whitespace."""
    own = schema.get("x-guidance", {})
    if "whitespace_flexible" in own or "whitespace_pattern" in own:
        return schema
    return {**schema, "x-guidance": {**JSON_OPTIONS, **own}}


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match. kind: json_schema (source: the schema, a dict or its JSON text),
    json_object (any JSON object; no source), regex, lark (llguidance's Lark dialect) or gbnf (llama.cpp's
    grammar format)."""

    kind: str
    source: Any = None
    grammar: str = field(default="", compare=False, repr=False)  # llguidance's form, filled when checked

    def __post_init__(self):
        object.__setattr__(self, "grammar", compile_grammar(self.kind, self.source))

    def describe(self) -> str:
        return self.kind if self.kind == "json_object" else f"{self.kind} grammar"


def compile_grammar(kind: str, source) -> str:
    """llguidance's grammar for a spec, checked (InvalidParameterError with one line: a bound the grammar
    breaks, a keyword refused, or the compiler's first line). Compiled on a deep stack (grammar_bounds.py)."""
    if kind not in GRAMMAR_KINDS:
        raise InvalidParameterError(f"unknown grammar kind {kind!r} (choose from {', '.join(GRAMMAR_KINDS)})")
    if kind == "json_schema":
        try:
            source = json.loads(source) if isinstance(source, str) else source
        except json.JSONDecodeError as error:
            raise InvalidParameterError(f"{kind}: {first_line(error)}") from None
        except RecursionError:
            raise InvalidParameterError(f"{kind}: nested too deeply") from None
        if not isinstance(source, dict):
            raise InvalidParameterError("a JSON schema must be a JSON object")
    elif kind != "json_object" and (not isinstance(source, str) or not source):
        raise InvalidParameterError(f"a {kind} grammar must be non-empty text")
    check_grammar_bounds(kind, source)
    if kind == "json_schema":
        check_json_schema(source)
    return on_deep_stack(lambda: _compiled(kind, source), MAX_COMPILE_SECONDS, f"the {kind} grammar")


def _compiled(kind: str, source) -> str:
    from llguidance import LLMatcher

    try:
        if kind == "json_object":
            grammar = LLMatcher.grammar_from_json_schema(with_json_options({"type": "object"}))
        elif kind == "json_schema":
            grammar = LLMatcher.grammar_from_json_schema(with_json_options(source))
        elif kind == "regex":
            grammar = LLMatcher.grammar_from_regex(source)
        else:
            grammar = LLMatcher.grammar_from_lark(source if kind == "lark" else lark_of_gbnf(source))
    except (ValueError, TypeError) as error:  # the compilers' refusals
        raise InvalidParameterError(f"{kind}: {first_line(error)}") from None
    except RecursionError:  # a schema or grammar nested past what the converters walk
        raise InvalidParameterError(f"{kind}: nested too deeply") from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise InvalidParameterError(f"{kind}: {first_line(messages[0])}")
    return grammar


# Keywords the grammar engine accepts but cannot honour exactly: refused rather than ignored.
# patternProperties: keys matching a pattern may repeat ({"a": 1, "a": 1}): no grammar of the text can
# forbid a key it has already written when the keys are not a fixed list.
REFUSED_KEYWORDS = {"patternProperties": "its keys could repeat in the output; list the keys under properties"}
# Keywords whose values are subschemas (a map of them, a list of them, or one).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def check_json_schema(schema: dict) -> None:
    """InvalidParameterError for a schema that is not a valid JSON Schema (its meta-schema, by the
    jsonschema library: `multipleOf: -1`, `type: "integr"`), or that uses a keyword in REFUSED_KEYWORDS."""
    from jsonschema import Draft202012Validator, SchemaError, validators  # not on the CLI's fast path

    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as error:
        where = "/".join(str(part) for part in error.path)
        raise InvalidParameterError(f"json_schema: {where + ': ' if where else ''}{first_line(error.message)}") from None
    for node in subschemas(schema):
        for keyword, why in REFUSED_KEYWORDS.items():
            if keyword in node:
                raise InvalidParameterError(f"json_schema: {keyword} is not supported: {why}")


def subschemas(schema: dict):
    """The schema and every schema inside it, by keyword position (a property named like a keyword is a
    name, not a keyword)."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        yield node
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                pending.extend(node[key].values())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                pending.extend(node[key])
        for key in _SCHEMA_ONES:
            value = node.get(key)
            pending.extend(value if isinstance(value, list) else [value])


def lark_of_gbnf(source: str) -> str:
    """llama.cpp's GBNF as llguidance's Lark, by llguidance's own converter (which raises bare Exceptions:
    a missing rule, a syntax error)."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(source)
    except RecursionError:
        raise
    except Exception as error:
        raise ValueError(first_line(error)) from None


def first_line(error) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


_tokenizers: dict[int, tuple[object, object]] = {}  # id(tokenizer) -> (tokenizer, its llguidance view)
_tokenizers_lock = threading.Lock()


def guidance_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a Hugging Face tokenizer over `vocab_size` ids (the model's LM head width), built
    once per tokenizer object."""
    import llguidance.hf

    with _tokenizers_lock:
        entry = _tokenizers.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size))
            _tokenizers[id(tokenizer)] = entry
        return entry[1]


def check_startable(spec: GrammarSpec, tokenizer, vocab_size: int) -> None:
    """InvalidParameterError where a grammar cannot begin an output or the engine gives up within its first
    tokens: what a request's own grammar is refused for when it starts (GrammarConstraint's probe), asked
    of a grammar before it becomes part of another (a tool's parameters inside the call grammar)."""
    GrammarConstraint(spec, tokenizer, vocab_size)


class GrammarConstraint(Constraint):
    """A generation's llguidance matcher: its state is always the committed tokens; paths are tried and
    rolled back."""

    def __init__(self, spec: GrammarSpec, tokenizer, vocab_size: int):
        from llguidance import LLMatcher

        self.vocab_size, self.spec = vocab_size, spec
        self.matcher = LLMatcher(guidance_tokenizer(tokenizer, vocab_size), spec.grammar)
        self._raise_if_failed()  # what the compiler accepted but the matcher could not build (huge bounds)
        self.mask_bytes = len(self.matcher.compute_bitmask())  # llguidance's vocabulary may run past the head's
        self._check_startable(getattr(tokenizer, "eos_token_id", None))

    def _check_startable(self, eos: int | None) -> None:
        """Refuse, before any token, a grammar that cannot begin an output or that the engine gives up on
        within its first tokens: it allows only the end (a $ref cycle with no base case), or its lexer
        runs out of resources (a regex repeated a million times). Walks PROBE_TOKENS steps along the first
        allowed token, then rolls back."""
        walked = 0
        for _ in range(PROBE_TOKENS):
            bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
            self._raise_if_failed(first=walked == 0)
            steps = [int(token) for token in np.flatnonzero(bits[:self.vocab_size]) if token != eos]
            if not steps or not self.matcher.consume_token(steps[0]):
                break
            walked += 1
        self._raise_if_failed()
        self.matcher.rollback(walked)

    def _raise_if_failed(self, first: bool = False) -> None:
        """InvalidParameterError where the matcher is in its error state (`first`: at the first mask)."""
        if not self.matcher.is_error():
            return
        if first:
            raise InvalidParameterError(f"{self.spec.describe()}: no output can start (a $ref cycle with no "
                                        "base case, or a grammar that allows nothing)")
        raise InvalidParameterError(f"{self.spec.describe()}: the grammar engine gave up on it "
                                    f"({first_line(self.matcher.get_error())})")

    def forced(self, limit: int) -> list[int]:
        return list(self.matcher.compute_ff_tokens()[:limit]) if limit > 0 else []

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        return self.matcher.validate_tokens(list(tokens))

    def masks(self, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = []
        for path in paths:
            path = list(path)
            if path and self.matcher.validate_tokens(path) < len(path):  # never used: see Constraint.masks
                rows.append(np.full(self.mask_bytes, 255, dtype=np.uint8))
                continue
            if path:
                self.matcher.consume_tokens(path)
            rows.append(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8))
            self._raise_if_failed()  # a lexer out of resources mid-output: an error, never a silent end
            if path:
                self.matcher.rollback(len(path))
        bits = np.unpackbits(np.stack(rows), axis=-1, bitorder="little")[:, :self.vocab_size]  # (P, V)
        return torch.from_numpy(bits.astype(bool))

    def commit(self, tokens: Sequence[int]) -> None:
        if tokens and not self.matcher.consume_tokens(list(tokens)):
            raise RuntimeError(f"committed tokens the grammar forbids: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        return self.matcher.is_stopped()
