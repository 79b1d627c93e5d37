"""`specdec certify`: evidence that a speculative configuration decodes exactly as its target.

The names below load on first use, so that the CLI's parser (certify/command.py) costs no import of the
statistics and the bench's prompt sets."""

from __future__ import annotations

import importlib

_EXPORTS = {"CertifyReport": "local", "CertifySettings": "local", "certify_local": "local",
            "ChiSquareResult": "statistics", "goodness_of_fit": "statistics", "homogeneity": "statistics"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdec.certify' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specdec.certify.{_EXPORTS[name]}"), name)
