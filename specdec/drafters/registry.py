"""Every drafter kind in one table: its spec syntax, what it is for, how to build it, and a spec the test
suite runs it with. The spec parser (`make_drafter`), the CLI's help text and the test suite's list of
drafters all come from here, so adding a drafter is one file (the drafter and its `build`) and one entry.

A spec is `KIND[:ARGUMENT][@KEY=VALUE,...]`: the argument is whatever the kind's `build` reads (a model,
a directory, `lookahead:4,3,4`), and the options after '@' are parsed here, once, into a `DrafterSpec`
(keys checked against the kind's declared `options`); each builder turns their values into its typed
options. `A+B` combines chain drafters (drafters/combined.py); `none` is plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specdec.drafters import draft_model, heads, lookahead, ngram, recycle, retrieval, self_draft
from specdec.drafters.base import Drafter
from specdec.drafters.combined import CombinedDrafter
from specdec.drafters.draft_options import DraftModelOptions, DraftOptions
from specdec.drafters.eagle import TreeOptions
from specdec.drafters.spec import DrafterSpec, NoOptions, option_types
from specdec.errors import InvalidParameterError

Builder = Callable[[DrafterSpec, object, str, str], Drafter]  # (spec, target LoadedModel, device, dtype)


@dataclass(frozen=True)
class DrafterKind:
    name: str
    syntax: str  # the spec's grammar, as help text shows it
    summary: str  # what drafts, in a few words
    build: Builder
    needs_argument: bool = False
    # the options it takes after '@': a frozen dataclass (its fields are the keys, their types what the text
    # converts to, its __post_init__ the range checks), built once by parse_spec
    options: type = NoOptions
    bare_option: str | None = None  # a value given without a key is this option's (draft:M@0.4: a confidence)
    # InvalidParameterError for a spec's argument that cannot be right, so that a command refuses it before
    # it loads anything
    check: Callable[[DrafterSpec], None] = lambda spec: None
    # A spec the test suite runs on a tiny random target ({target}: that target's directory), or None where
    # the kind needs files a test cannot make in passing (then its own tests cover it).
    test_spec: str | None = None


KINDS = [
    DrafterKind("ngram", "ngram[:MAX_N][@memory=TOKENS]", "lookup of the context's last tokens in prompt + "
                "output (memory: and in earlier generations' outputs)", ngram.build,
                options=ngram.NgramOptions, check=ngram.check, test_spec="ngram"),
    DrafterKind("recycle", "recycle[@successors=N,shape=chain|tree,width=W,levels=L,shared=0|1]",
                "the target's own candidate tokens from earlier verify rows, recycled (no forward)", recycle.build,
                options=recycle.RecycleOptions, test_spec="recycle"),
    DrafterKind("draft", "draft:MODEL[@confidence=C,vocab=N,context=N,start=N,weights=FORMAT,adapter=DIR]",
                "a smaller model (another tokenizer's drafts go through text)",
                draft_model.build, needs_argument=True, test_spec="draft:{target}",
                options=DraftModelOptions, bare_option="confidence"),
    DrafterKind("quant", "quant:int8|int4[:GROUP]|int7[:GROUP]|gguf[@confidence=C,vocab=N,context=N,start=N]",
                "the target itself, quantized", self_draft.build_quantized,
                needs_argument=True, test_spec="quant:int8", options=DraftOptions, bare_option="confidence",
                check=self_draft.check_quant_spec),
    DrafterKind("layerskip", "layerskip[:SUBSET]", "the target running a subset of its layers",
                self_draft.build_layer_skip, test_spec="layerskip:first:1", check=self_draft.check_layer_skip_spec),
    DrafterKind("eagle", "eagle[:HEAD_DIR][@depth=D,topk=W,budget=N]", "an EAGLE head, dynamic trees",
                heads.build_eagle, options=TreeOptions),
    DrafterKind("medusa", "medusa[:HEAD_DIR][@budget=N]", "Medusa heads, a static tree",
                heads.build_medusa, options=heads.MedusaOptions),
    DrafterKind("retrieval", "retrieval:DATASTORE_DIR[@budget=N,depth=D]", "continuations found in a datastore",
                retrieval.build, needs_argument=True, options=retrieval.RetrievalOptions),
    DrafterKind("lookahead", "lookahead[:W,N,G]", "Jacobi iterations riding along in the verify forward",
                lookahead.build, test_spec="lookahead:4,3,4", check=lookahead.check),
]
REGISTRY: dict[str, DrafterKind] = {kind.name: kind for kind in KINDS}


def specs_help() -> str:
    """Every spec the registry knows, for --drafter's help and error messages."""
    return " | ".join(["none (plain decoding)", *(f"{kind.syntax} ({kind.summary})" for kind in KINDS),
                       "SPEC+SPEC (chain drafters, the first that proposes drafts: ngram+draft:MODEL)"])


def parse_spec(text: str) -> DrafterSpec:
    """'KIND[:ARGUMENT][@KEY=VALUE,...]' -> DrafterSpec, the options' keys checked against the kind's
    (InvalidParameterError: an unknown kind or option). A model path may hold ':' (its argument); options
    follow the last '@'."""
    head, at, option_text = text.rpartition("@") if "@" in text else (text, "", "")
    kind_name, _, argument = head.partition(":")
    kind = REGISTRY.get(kind_name)
    if kind is None or (kind.needs_argument and not argument):
        raise InvalidParameterError(f"unknown drafter {text!r} (choose from: {specs_help()})")
    types = option_types(kind.options)
    options: dict[str, int | float | str] = {}
    for item in filter(None, option_text.split(",")):
        key, equals, value = item.partition("=")
        if not equals and kind.bare_option is not None:
            key, value = kind.bare_option, item
        if key not in types or not value:
            known = ", ".join(f"{option}=..." for option in types) or "none"
            raise InvalidParameterError(f"{kind_name} drafter: unknown option {item!r} (options: {known})")
        try:
            options[key] = types[key](value)
        except ValueError:
            raise InvalidParameterError(f"{kind_name} drafter: {key}={value!r} is not "
                                        f"{'a whole number' if types[key] is int else 'a number'}") from None
    if at and not option_text:
        raise InvalidParameterError(f"drafter {text!r}: nothing after '@'")
    try:
        spec = DrafterSpec(kind_name, argument, kind.options(**options), text)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{kind_name} drafter: {error}") from None
    kind.check(spec)
    return spec


@dataclass(frozen=True)
class DrafterChoice:
    """What a drafter option names, parsed once (`parse`): "auto" (or its older name "default": the drafter
    calibrated for the target on this machine, which the generator resolves once the target is loaded), "none" (plain decoding, no specs), one spec, or
    several joined by '+' (drafters/combined.py: the first that proposes drafts)."""

    specs: tuple[DrafterSpec, ...] = ()
    default: bool = False
    text: str = "none"

    @classmethod
    def parse(cls, text: "str | DrafterChoice") -> "DrafterChoice":
        """The one reader of the spec grammar (InvalidParameterError: an unknown kind or option, 'none' in
        a '+' chain); a DrafterChoice is returned as it is."""
        if isinstance(text, DrafterChoice):
            return text
        if text in ("auto", "default", "none"):
            return cls((), text != "none", text)
        parts = text.split("+")
        if "none" in parts:
            raise InvalidParameterError(f"drafter {text!r}: 'none' cannot be combined")
        return cls(tuple(parse_spec(part) for part in parts), False, text)

    @property
    def is_plain(self) -> bool:
        """'none': plain decoding."""
        return not self.specs and not self.default

    @property
    def draft_model(self) -> str | None:
        """The draft model it runs ('draft:MODEL', alone or in a '+' chain), else None."""
        return next((spec.argument for spec in self.specs if spec.kind == "draft"), None)


def draft_model_of(spec: "str | DrafterChoice") -> str | None:
    """The draft model a spec runs ('draft:MODEL', alone or in a '+' chain), else None."""
    return DrafterChoice.parse(spec).draft_model


def split_drafter_specs(text: str) -> list[str]:
    """'ngram,eagle@depth=4,topk=4,draft:M,lookahead:4,3,4' -> ['ngram', 'eagle@depth=4,topk=4', 'draft:M',
    'lookahead:4,3,4']: a list of specs (bench --drafters) where a drafter's options (key=value after '@')
    and lookahead's W,N,G contain commas too; no drafter spec is a bare number or a bare key=value."""
    specs: list[str] = []
    for item in filter(None, text.split(",")):
        option = "@" in specs[-1] and "=" in item and ":" not in item and "@" not in item if specs else False
        if specs and (option or item.isdigit()):
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def make_drafter(choice: "str | DrafterChoice", target, device: str, dtype: str) -> Drafter | None:
    """Build the drafter `choice` names for `target` (a LoadedModel); None means plain decoding. "default" is
    the generator's to resolve (api/generator.py: auto_drafter), not the registry's."""
    choice = DrafterChoice.parse(choice)
    if choice.default:
        raise InvalidParameterError(f"drafter {choice.text!r} is resolved by the generator for its target")
    drafters = [REGISTRY[spec.kind].build(spec, target, device, dtype) for spec in choice.specs]
    if len(drafters) > 1:
        return CombinedDrafter(drafters)
    return drafters[0] if drafters else None
