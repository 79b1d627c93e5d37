"""What identifies a target: sha256 of its weight files and of its tokenizer's vocabulary.

Trained heads (EAGLE, Medusa) record both and are refused by any other target. Hashing a 6 GB
checkpoint takes seconds, so a weight file's digest is remembered under $SPECDEC_HOME, keyed by
the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from specdec.models.sources.checkpoint import safetensors_files
from specdec.models.sources.file_memo import remembered
from specdec.models.sources.gguf_file import GgufFile
from specdec.models.sources.gguf_source import gguf_source


def file_sha256(path: Path) -> str:
    return remembered("sha256", path, _sha256)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(model_dir: Path) -> str:
    """The GGUF file's digest for a model converted from one (its float32 safetensors, written only when
    needed, are a function of it); else one digest over the *.safetensors files (each file's, in name order)."""
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
    digests = [f"{file.name}:{file_sha256(file)}" for file in safetensors_files(Path(model_dir))]
    return digests[0].split(":", 1)[1] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """Digest of the vocabulary (token -> id): what a head's token ids depend on."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def tokenizer_fingerprint(path: Path) -> str:
    """What a model's token ids mean, as a short digest of its tokens in id order, read from a GGUF file's
    metadata or a Hugging Face directory's tokenizer.json. Equal exactly when each id spells the same token in
    both, so a draft's ids mean the target's: Qwen2.5 files of any size or quantization share one; SmolLM2
    and Qwen do not. Merges and the pre-tokenizer decide how a text is split into ids, not what an id means
    (and a SentencePiece vocabulary has no merges in GGUF but gains some in tokenizer.json): left out.
    Trailing padding tokens (Qwen pads its vocabulary to the embedding's rows) are left out too, and
    SentencePiece's space mark read as the space it stands for (GGUF keeps user-defined whitespace tokens as
    spaces, tokenizer.json as "\u2581"). Remembered per file: reading a vocabulary takes a quarter second."""
    return remembered("tokenizer", path, _tokenizer_fingerprint) if path.is_file() else _tokenizer_fingerprint(path)


def _tokenizer_fingerprint(path: Path) -> str:
    tokens = gguf_tokens(path) if path.is_file() else tokenizer_json_tokens(path / "tokenizer.json")
    while tokens and _PADDING.fullmatch(tokens[-1]):
        tokens.pop()
    tokens = [token.replace("\u2581", " ") for token in tokens]
    return hashlib.sha256(json.dumps(tokens, ensure_ascii=False).encode()).hexdigest()[:16]


_PADDING = re.compile(r"\[PAD\d+\]|<\|?pad_?\d*\|?>")


def gguf_tokens(path: Path) -> list[str]:
    return GgufFile(path).strings("tokenizer.ggml.tokens")


def tokenizer_json_tokens(path: Path) -> list[str]:
    """Tokens by id (the model's vocabulary and the added tokens), from tokenizer.json."""
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    vocab = model.get("vocab") or {}
    by_id = dict(enumerate(piece for piece, _ in vocab)) if isinstance(vocab, list) else \
        {index: token for token, index in vocab.items()}
    by_id.update({added["id"]: added["content"] for added in data.get("added_tokens") or []})
    return [by_id.get(index, "") for index in range(max(by_id, default=-1) + 1)]
