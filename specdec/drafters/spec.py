"""One drafter's spec, parsed (drafters/registry.py reads the text; the builders take this)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class DrafterSpec:
    """`draft:MODEL@vocab=32768,weights=int4` -> kind "draft", argument "MODEL", options {"vocab": 32768,
    "weights": "int4"}."""

    kind: str
    argument: str = ""
    options: Mapping[str, int | float | str] = field(default_factory=dict)  # typed as the kind declares
    text: str = ""  # as written (the drafter's name in stats)
