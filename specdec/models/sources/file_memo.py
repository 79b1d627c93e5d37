"""A value computed from a file's content, remembered under $SPECDEC_HOME per (path, size, modification time,
inode): the file is read once, and a changed or replaced file is read again."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from specdec.paths import specdec_home


def remembered(kind: str, path: Path, compute: Callable[[Path], str]) -> str:
    """compute(path), remembered as `kind` (a one-line string value)."""
    stat = path.stat()
    where = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    memo = specdec_home() / "fingerprints" / f"{kind}-{hashlib.sha256(where.encode()).hexdigest()[:24]}"
    if memo.exists():
        return memo.read_text().strip()
    value = compute(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    partial = memo.with_suffix(".partial")
    partial.write_text(value)
    partial.replace(memo)
    return value
