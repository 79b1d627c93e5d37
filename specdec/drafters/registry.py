"""Every drafter kind in one table: its spec syntax, what it is for, how to build it, and a spec the test
suite runs it with. The spec parser (`make_drafter`), the CLI's help text and the test suite's list of
drafters all come from here, so adding a drafter is one file (the drafter and its `build`) and one entry.

A spec is `KIND[:ARGUMENT]`, where the argument is whatever the kind's `build` reads (`draft:MODEL@vocab=N`,
`lookahead:4,3,4`), options after '@' included; `A+B` combines chain drafters (drafters/combined.py);
`none` is plain decoding.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from specdec.drafters.base import Drafter
from specdec.errors import InvalidParameterError

Builder = Callable[[str, object, str, str], Drafter]  # (argument, target LoadedModel, device, dtype)


@dataclass(frozen=True)
class DrafterKind:
    name: str
    syntax: str  # the spec's grammar, as help text shows it
    summary: str  # what drafts, in a few words
    builder: str  # "module:function" taking (argument, target, device, dtype); imported when first used
    needs_argument: bool = False
    # A spec the test suite runs on a tiny random target ({target}: that target's directory), or None where
    # the kind needs files a test cannot make in passing (then its own tests cover it).
    test_spec: str | None = None

    def build(self, argument: str, target, device: str, dtype: str) -> Drafter:
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)(argument, target, device, dtype)


KINDS = [
    DrafterKind("ngram", "ngram[:MAX_N]", "lookup of the context's last tokens in prompt + output",
                "specdec.drafters.ngram:build", test_spec="ngram"),
    DrafterKind("draft", "draft:MODEL[@confidence=C,vocab=N,context=N,weights=FORMAT]",
                "a smaller model (another tokenizer's drafts go through text)",
                "specdec.drafters.draft_model:build",
                needs_argument=True, test_spec="draft:{target}"),
    DrafterKind("quant", "quant:int8|int4[:GROUP]|int7[:GROUP]|gguf[@confidence=C,vocab=N,context=N]",
                "the target itself, quantized", "specdec.drafters.self_draft:build_quantized",
                needs_argument=True, test_spec="quant:int8"),
    DrafterKind("layerskip", "layerskip[:SUBSET]", "the target running a subset of its layers",
                "specdec.drafters.self_draft:build_layer_skip", test_spec="layerskip:first:1"),
    DrafterKind("eagle", "eagle[:HEAD_DIR][@depth=D,topk=W,budget=N]", "an EAGLE head, dynamic trees",
                "specdec.drafters.heads:build_eagle"),
    DrafterKind("medusa", "medusa[:HEAD_DIR][@budget=N]", "Medusa heads, a static tree",
                "specdec.drafters.heads:build_medusa"),
    DrafterKind("retrieval", "retrieval:DATASTORE_DIR[@budget=N,depth=D]", "continuations found in a datastore",
                "specdec.drafters.retrieval:build", needs_argument=True),
    DrafterKind("lookahead", "lookahead[:W,N,G]", "Jacobi iterations riding along in the verify forward",
                "specdec.drafters.lookahead:build", test_spec="lookahead:4,3,4"),
]
REGISTRY: dict[str, DrafterKind] = {kind.name: kind for kind in KINDS}


def specs_help() -> str:
    """Every spec the registry knows, for --drafter's help and error messages."""
    return " | ".join(["none (plain decoding)", *(f"{kind.syntax} ({kind.summary})" for kind in KINDS),
                       "SPEC+SPEC (chain drafters, the first that proposes drafts: ngram+draft:MODEL)"])


def split_spec(spec: str) -> tuple[str, str]:
    """'kind:argument' -> (kind, argument); 'eagle@depth=4' (options, no argument) -> ('eagle', '@depth=4')."""
    kind, colon, argument = spec.partition(":")
    if "@" in kind:
        kind, _, options = kind.partition("@")
        argument = "@" + options + colon + argument
    return kind, argument


def make_drafter(spec: str, target, device: str, dtype: str) -> Drafter | None:
    """Build the drafter named by `spec` for `target` (a LoadedModel); None means plain decoding."""
    if "+" in spec:
        from specdec.drafters.combined import CombinedDrafter

        sources = [make_drafter(part, target, device, dtype) for part in spec.split("+")]
        if any(source is None for source in sources):
            raise InvalidParameterError(f"drafter {spec!r}: 'none' cannot be combined")
        return CombinedDrafter(sources)
    kind, argument = split_spec(spec)
    if kind == "none" and not argument:
        return None
    entry = REGISTRY.get(kind)
    if entry is None or (entry.needs_argument and not argument):
        raise InvalidParameterError(f"unknown drafter {spec!r} (choose from: {specs_help()})")
    return entry.build(argument, target, device, dtype)
