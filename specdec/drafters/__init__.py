"""Drafters: one file each behind `base.Drafter`, all listed in `registry` (specs, help text, builders)."""

from __future__ import annotations

from specdec.drafters.base import Drafter
from specdec.drafters.draft_options import DraftOptions, parse_draft_options
from specdec.drafters.registry import REGISTRY, make_drafter, specs_help
from specdec.rounds import Draft, VerifyResult

__all__ = ["Draft", "DraftOptions", "Drafter", "REGISTRY", "VerifyResult", "make_drafter", "parse_draft_options",
           "specs_help"]
