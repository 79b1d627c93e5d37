"""How big a grammar may be before the grammar engine sees it, and the deep stack it is compiled on.

llguidance walks a grammar's rules and a JSON schema's references recursively in native code: a chain of a
few thousand rules (`r0 ::= "x" r1`, `r1 ::= "x" r2`, ...) or of `$ref`s overflows an 8 MiB thread stack and
the process dies with a segfault, taking every other client's stream with it; its GBNF converter is also
quadratic in the rule count (minutes at 10,000 rules). So every grammar, whatever its kind, is measured
first (`check_grammar_bounds`: size, rules, nesting and reference-chain depth, one line naming the bound
it breaks), and what passes is compiled on a thread whose stack is far deeper than any grammar within the
bounds needs (`on_deep_stack`), so that a recursion the bounds did not foresee still cannot take the
process down.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from specdec.errors import InvalidParameterError

MAX_GRAMMAR_CHARS = 256 * 1024  # a grammar's text, or a JSON schema's JSON: an agent's tools fit well within
MAX_GRAMMAR_RULES = 1000  # rules of a GBNF/Lark grammar, or definitions of a JSON schema ($defs)
MAX_GRAMMAR_DEPTH = 256  # parentheses or JSON nesting, and the longest chain of rule references
DEEP_STACK_BYTES = 256 << 20  # virtual: only the pages a recursion touches are ever committed
# a compile within the size bounds still may take long (many tools' schemas, wide alternations): past this,
# the request gets its 400 and the compile finishes on its own thread, nobody waiting on it
MAX_COMPILE_SECONDS = 20.0

T = TypeVar("T")


@dataclass(frozen=True)
class GrammarSize:
    """What the bounds compare: characters of source, rules (or schema definitions), nesting depth and
    the longest chain of references from one rule to the next (a cycle counted once)."""

    chars: int
    rules: int
    nesting: int
    chain: int
    rule_word: str = "rules"  # what a schema calls its rules: definitions

    def broken_bound(self) -> str | None:
        """The first bound this size breaks, as the error's words, or None."""
        if self.chars > MAX_GRAMMAR_CHARS:
            return f"{self.chars} characters; at most {MAX_GRAMMAR_CHARS} are accepted"
        if self.rules > MAX_GRAMMAR_RULES:
            return f"{self.rules} {self.rule_word}; at most {MAX_GRAMMAR_RULES} are accepted"
        if self.nesting > MAX_GRAMMAR_DEPTH:
            return f"nesting {self.nesting} deep; at most {MAX_GRAMMAR_DEPTH} is accepted"
        if self.chain > MAX_GRAMMAR_DEPTH:
            return (f"a chain of {self.chain} {self.rule_word} each naming the next; at most {MAX_GRAMMAR_DEPTH} "
                    "is accepted")
        return None


def check_grammar_bounds(kind: str, source: Any) -> None:
    """InvalidParameterError naming the bound a grammar of `kind` (json_schema: a dict or its JSON text;
    regex, lark, gbnf: text) breaks; nothing for json_object, whose grammar is ours."""
    if kind == "json_object" or source is None:
        return
    size = schema_size(source) if kind == "json_schema" and isinstance(source, dict) else text_size(kind, source)
    broken = size.broken_bound()
    if broken is not None:
        raise InvalidParameterError(f"{kind}: the grammar is too large: {broken}")


# -- text grammars (GBNF, Lark, regex) --------------------------------------------------------------
# What a rule's body holds that is not a rule name: quoted strings, character classes, /regexes/ (Lark)
# and comments; these are blanked before names and parentheses are read.
_LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\[(?:\\.|[^\]\\])*\]|/(?:\\.|[^/\\\n])+/[imslux]*'
                      r'|(?://|#)[^\n]*')
_GBNF_RULE = re.compile(r"^[ \t]*([A-Za-z0-9_-]+)[ \t]*::=", re.M)
_LARK_RULE = re.compile(r"^[ \t]*[?!]?([A-Za-z_][A-Za-z_0-9]*)(?:\.-?\d+)?[ \t]*:", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def text_size(kind: str, text: Any) -> GrammarSize:
    """The size of a GBNF, Lark or regex grammar's text. A Lark grammar's `%json {...}` schemas (what tool
    call grammars embed) count as schemas: their definitions as rules, their nesting and chains as depth."""
    if not isinstance(text, str):
        return GrammarSize(0, 0, 0, 0)  # not text: the compiler refuses it in its own words
    if len(text) > MAX_GRAMMAR_CHARS:  # too large already: not worth reading
        return GrammarSize(len(text), 0, 0, 0)
    schemas, text_without = _embedded_schemas(text) if kind == "lark" else ([], text)
    blanked = _LITERAL.sub(" ", text_without) if kind != "regex" else text_without
    nesting = _paren_depth(blanked)
    rules, chain = 0, 0
    if kind in ("gbnf", "lark"):
        rule_pattern = _GBNF_RULE if kind == "gbnf" else _LARK_RULE
        bodies = _rule_bodies(blanked, rule_pattern)
        rules = len(bodies)
        if rules <= MAX_GRAMMAR_RULES:  # a chain is measured only where the count is already bounded
            chain = longest_chain({name: set(_NAME.findall(body)) & bodies.keys() for name, body in bodies.items()})
    inner = [schema_size(schema) for schema in schemas]
    return GrammarSize(len(text), rules + sum(s.rules for s in inner), max([nesting, *(s.nesting for s in inner)]),
                       max([chain, *(s.chain for s in inner)]))


def _rule_bodies(text: str, rule_pattern: re.Pattern) -> dict[str, str]:
    """Rule name -> its body (the text up to the next rule's head); a name defined twice keeps both."""
    heads = list(rule_pattern.finditer(text))
    bodies: dict[str, str] = {}
    for index, head in enumerate(heads):
        end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
        name = head.group(1)
        bodies[name] = bodies.get(name, "") + " " + text[head.end():end]
    return bodies


def _embedded_schemas(text: str) -> tuple[list, str]:
    """(the JSON schemas a Lark grammar embeds with `%json`, the text without them)."""
    schemas, kept, position = [], [], 0
    decoder = json.JSONDecoder()
    for marker in re.finditer(r"%json\s*", text):
        if marker.start() < position:
            continue
        try:
            schema, end = decoder.raw_decode(text, marker.end())
        except (json.JSONDecodeError, RecursionError):
            continue  # not JSON: the compiler says so
        schemas.append(schema)
        kept.append(text[position:marker.start()])
        position = end
    kept.append(text[position:])
    return schemas, " ".join(kept)


def _paren_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "({":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}":
            depth = max(0, depth - 1)
    return deepest


# -- JSON schemas -------------------------------------------------------------------------------
def schema_size(schema: Any) -> GrammarSize:
    """A JSON schema's size: its JSON's length, its definitions ($defs / definitions, at any level) as
    rules, the nesting of its JSON, and the longest chain of `$ref`s between definitions."""
    nesting = _json_depth(schema)
    chars = len(json.dumps(schema)) if nesting <= MAX_GRAMMAR_DEPTH else 0  # json.dumps recurses
    definitions: dict[str, Any] = {}
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key in ("$defs", "definitions"):
                if isinstance(node.get(key), dict):
                    definitions.update({f"#/{key}/{name}": body for name, body in node[key].items()})
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    chain = 0
    if len(definitions) <= MAX_GRAMMAR_RULES:
        chain = longest_chain({name: set(_references(body)) & definitions.keys() for name, body in definitions.items()})
    return GrammarSize(chars, len(definitions), nesting, chain, "definitions")


def _json_depth(value: Any) -> int:
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > MAX_GRAMMAR_DEPTH * 4:  # already past any bound: stop walking
                return deepest
            pending.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _references(node: Any) -> list[str]:
    found, pending = [], [node]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.append(node["$ref"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def longest_chain(graph: dict[str, set[str]]) -> int:
    """The most rules on one path of references (a rule naming itself, or a cycle, adds nothing more),
    walked without recursion: the graphs measured are the ones too deep to recurse over."""
    depth: dict[str, int] = {}
    for start in graph:
        if start in depth:
            continue
        on_path, stack = {start}, [(start, iter(graph[start]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                depth[node] = 1 + max((depth.get(c, 0) for c in graph[node] if c not in on_path), default=0)
            elif child not in depth and child not in on_path:
                on_path.add(child)
                stack.append((child, iter(graph[child])))
    return max(depth.values(), default=0)


# -- the deep stack ---------------------------------------------------------------------------------
_stack_lock = threading.Lock()


def start_deep_stack_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A started thread with a DEEP_STACK_BYTES stack, for native code that recurses over a grammar:
    grammar compiles, and the server's worker, which builds matchers and computes masks."""
    with _stack_lock:  # threading.stack_size is process-wide and read at start: set it around this start only
        previous = threading.stack_size(DEEP_STACK_BYTES)
        try:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            return thread
        finally:
            threading.stack_size(previous)


def on_deep_stack(function: Callable[[], T], seconds: float | None = None, what: str = "the work") -> T:
    """function() run on a deep-stack thread: its result, or its exception raised here; past `seconds` (None:
    no bound) InvalidParameterError naming the bound (the thread finishes on its own, its result dropped)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # handed to the caller, whatever it is
            outcome["error"] = error

    worker = start_deep_stack_thread(run, "specdec-grammar")
    worker.join(seconds)
    if worker.is_alive():
        raise InvalidParameterError(f"{what} took longer than {seconds:g} s to compile (the bound on a request's "
                                    "grammar); simplify it or split it")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
