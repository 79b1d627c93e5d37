"""What identifies a target: sha256 of its weight files and of its tokenizer's vocabulary.

Trained heads (EAGLE, Medusa) record both and are refused by any other target. Hashing a 6 GB
checkpoint takes seconds, so a weight file's digest is remembered under $SPECDEC_HOME, keyed by
the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdec.paths import specdec_home


def file_sha256(path: Path) -> str:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = specdec_home() / "fingerprints" / f"{key}.sha256"
    if memo.exists():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    memo.parent.mkdir(parents=True, exist_ok=True)
    partial = memo.with_suffix(".partial")
    partial.write_text(digest.hexdigest())
    partial.replace(memo)
    return digest.hexdigest()


def weights_sha256(model_dir: Path) -> str:
    """The GGUF file's digest for a model converted from one (its float32 safetensors, written only when
    needed, are a function of it); else one digest over the *.safetensors files (each file's, in name order)."""
    from specdec.models.sources.gguf_source import gguf_source

    source = gguf_source(Path(model_dir))
    return file_sha256(source) if source is not None else safetensors_sha256(model_dir)


def weights_identities(model_dir: Path) -> set[str]:
    """Every digest a head trained on this model may have recorded: `weights_sha256`, and for a GGUF-sourced
    model whose float32 safetensors exist, their digest too (what heads recorded before GGUF digests)."""
    identities = {weights_sha256(model_dir)}
    if any(Path(model_dir).glob("*.safetensors")):
        identities.add(safetensors_sha256(model_dir))
    return identities


def safetensors_sha256(model_dir: Path) -> str:
    from specdec.models.sources.loading import safetensors_files

    digests = [f"{file.name}:{file_sha256(file)}" for file in safetensors_files(Path(model_dir))]
    return digests[0].split(":", 1)[1] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """Digest of the vocabulary (token -> id): what a head's token ids depend on."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
