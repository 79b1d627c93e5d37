"""One drafter's spec, parsed (drafters/registry.py reads the text; the builders take this), and the
options dataclasses' shared parts: each kind declares its options after '@' as one frozen dataclass whose
fields are the keys, whose types are what the text converts to, and whose __post_init__ checks ranges."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class NoOptions:
    """A kind that takes no options after '@'."""


@dataclass(frozen=True)
class DrafterSpec:
    """`draft:MODEL@vocab=32768,weights=int4` -> kind "draft", argument "MODEL",
    options DraftModelOptions(vocab=32768, weights="int4")."""

    kind: str
    argument: str = ""
    options: object = field(default_factory=NoOptions)  # the kind's options dataclass, typed and checked
    text: str = ""  # as written (the drafter's name in stats)


def option_types(options_class: type) -> dict[str, type]:
    """{key: the type its text converts to} of an options dataclass (`int | None` converts to int)."""
    hints = typing.get_type_hints(options_class)
    converted = {}
    for option in fields(options_class):
        hint = hints[option.name]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(arm for arm in typing.get_args(hint) if arm is not type(None))
        converted[option.name] = hint
    return converted
