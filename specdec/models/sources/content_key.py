"""What a GGUF file is, whatever its path: a content key, so that one file reached under another name, a link
or a model store's blob name (Ollama names its files by digest) reuses its conversion and packed caches, and a
copy of a zoo model drafts as the zoo name does.

The key hashes the file's size, its first 8 MiB (the header: metadata, the vocabulary, the tensor table) and
16 blocks of 64 KiB spread over the rest (the weights: two fine-tunes of one architecture share a header,
not their tensors). Reading ~9 MB costs milliseconds where hashing a 1 GB file costs seconds; the key is
remembered per (path, size, modification time, inode) under $SPECDEC_HOME.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specdec.models.sources import zoo
from specdec.models.sources.file_memo import remembered

HEAD_BYTES = 8 << 20
SAMPLES = 16
SAMPLE_BYTES = 64 << 10


def gguf_content_key(path: Path) -> str:
    return remembered("content", path, _content_digest)


def _content_digest(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(HEAD_BYTES))
        rest = size - HEAD_BYTES
        if rest > 0:
            for index in range(SAMPLES):
                handle.seek(HEAD_BYTES + rest * index // SAMPLES)
                digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:32]


def zoo_name_of(path: Path) -> str | None:
    """The zoo model whose pulled GGUF file has this file's content (a renamed or linked copy), if any."""
    size = path.stat().st_size
    for name in zoo.REGISTRY:
        source = zoo.model_dir(name) / f"{name}.gguf" if zoo.is_pulled(name) else None
        if source is None or not source.is_file() or source.stat().st_size != size:
            continue
        if source.resolve() == path.resolve() or gguf_content_key(source) == gguf_content_key(path):
            return name
    return None
