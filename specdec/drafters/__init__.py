"""Drafters: one file each behind `base.Drafter`, all listed in `registry` (specs, help text, builders)."""

from __future__ import annotations

from specdec.drafters.base import Drafter
from specdec.drafters.draft_options import DraftModelOptions, DraftOptions
from specdec.drafters.registry import (REGISTRY, DrafterChoice, DrafterSpec, draft_model_of, make_drafter, parse_spec,
                                       specs_help)
from specdec.core.rounds import Draft, VerifyResult

__all__ = ["Draft", "DraftModelOptions", "DraftOptions", "Drafter", "DrafterChoice", "DrafterSpec", "REGISTRY",
           "VerifyResult", "make_drafter", "draft_model_of", "parse_spec", "specs_help"]
