"""Where specdec keeps pulled and converted models.

$SPECDEC_HOME if set, else ~/.cache/specdec. Layout:
  models/NAME/        a pulled zoo model: NAME.gguf, hf/ (converted), manifest.json
  converted/STEM-KEY/ a GGUF file named by path, converted to a Hugging Face directory
"""

from __future__ import annotations

import os
from pathlib import Path


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")


def models_dir() -> Path:
    return specdec_home() / "models"


def converted_dir() -> Path:
    return specdec_home() / "converted"
