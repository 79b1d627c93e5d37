"""A model directory's tokenizer (shared between models whose tokenizer files are the same bytes) and every
token id that ends its generation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdec.errors import CorruptModelError


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
_tokenizers: dict[str, object] = {}  # the tokenizer files' digest -> the tokenizer loaded from them


def same_vocabulary(tokenizer, model_dir: Path) -> bool:
    """Whether `tokenizer` (or None) was loaded from a tokenizer.json with the same bytes as model_dir's."""
    if tokenizer is None:
        return False
    theirs, ours = Path(getattr(tokenizer, "name_or_path", "")) / "tokenizer.json", model_dir / "tokenizer.json"
    return theirs.is_file() and ours.is_file() and theirs.read_bytes() == ours.read_bytes()


def load_tokenizer(model_dir: Path):
    """The directory's tokenizer. Models whose tokenizer files are the same bytes (a draft of the target's
    family) share one object: building a 152k-token tokenizer costs over a second a load."""
    from transformers import AutoTokenizer

    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()
    if key not in _tokenizers:
        try:
            _tokenizers[key] = AutoTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as exc:
            raise CorruptModelError(f"{model_dir}: no usable tokenizer ({exc})".splitlines()[0]) from None
    return _tokenizers[key]


def eos_token_ids(model_dir: Path, hf_config: dict, tokenizer) -> tuple[int, ...]:
    """Every id that ends generation: config, generation_config.json and the tokenizer's EOS."""
    ids: set[int] = set()
    sources = [hf_config.get("eos_token_id")]
    generation_config = model_dir / "generation_config.json"
    if generation_config.exists():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    sources.append(getattr(tokenizer, "eos_token_id", None))
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(i) for i in source)
    return tuple(sorted(ids))
