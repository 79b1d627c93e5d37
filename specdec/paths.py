"""Where specdec keeps pulled and converted models.

$SPECDEC_HOME if set, else ~/.cache/specdec. Layout:
  models/NAME/        a pulled zoo model: NAME.gguf, hf/ (config, tokenizer; float32 weights once needed), manifest.json
  converted/STEM-KEY/ a GGUF file named by path, converted to a Hugging Face directory
  packed/NAME-FORMAT-KEY.safetensors  a checkpoint's linear layers quantized and packed for the CPU kernels
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")


def models_dir() -> Path:
    return specdec_home() / "models"


def converted_dir() -> Path:
    return specdec_home() / "converted"


def replace_flushed(partial: Path, final: Path) -> None:
    """Rename a fully written file into place after flushing it to disk: a crash cannot leave a renamed
    file with missing blocks, and the gigabytes a cache write leaves dirty are written back now, during the
    load, rather than competing with the first generation for the CPU."""
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, final)


@contextmanager
def building_directory(final: Path) -> Iterator[Path]:
    """Build a directory under a temporary sibling name; it replaces `final` only on success.

    An interrupted or failed build leaves nothing that looks finished, and the next
    build removes the leftovers first.
    """
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
