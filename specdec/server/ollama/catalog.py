"""What Ollama's model routes say of the models a server serves: names as Ollama users write them, and each
model's card (/api/tags' size, digest and details; /api/show's model_info, template and capabilities), read
from its GGUF file's header or its directory's config, never by loading it.

Names: Ollama's are NAME:TAG. A model of Ollama's store is served as `ollama:NAME:TAG` and listed as NAME:TAG; any
other model is listed with the tag `latest`; a request's name matches a served name as it is, without
`:latest`, or as a model of Ollama's store (`qwen2.5-coder` meaning `ollama:qwen2.5-coder:latest`)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from gguf import LlamaFileType

from specdec.errors import SpecdecError
from specdec.models.sources.gguf_file import GgufFile, SkippedArray
from specdec.models.sources.gguf_source import gguf_source
from specdec.models.sources.local_models import directory_facts
from specdec.server.infill import KNOWN_FORMATS
from specdec.server.served_models import ModelNotFound
from specdec.server.tools import template_speaks_hermes

OLLAMA_PREFIX, LATEST = "ollama:", ":latest"
FOREVER = "2318-01-01T00:00:00Z"  # a model that stays loaded, as Ollama writes an endless keep_alive's end


def listed_name(served: str) -> str:
    """A served name as Ollama's routes list it."""
    if served.startswith(OLLAMA_PREFIX):
        return served.removeprefix(OLLAMA_PREFIX)
    return served if ":" in served else served + LATEST


def served_name(requested: str, served: list[str]) -> str:
    """The served name a client's name means, else ModelNotFound (Ollama's 404)."""
    bare = requested.removesuffix(LATEST)
    for candidate in (requested, bare, OLLAMA_PREFIX + requested,
                      OLLAMA_PREFIX + (requested if ":" in requested else requested + LATEST)):
        if candidate in served:
            return candidate
    raise ModelNotFound(f"model {requested!r} not found (this server serves "
                        f"{', '.join(repr(listed_name(name)) for name in served)})")


@dataclass(frozen=True)
class ModelCard:
    """One model as Ollama's routes describe it."""

    path: Path  # its GGUF file or model directory
    size: int
    digest: str
    modified_at: str
    details: dict
    model_info: dict
    template: str
    capabilities: tuple[str, ...]
    license: str = ""

    def listing(self, name: str) -> dict:
        return {"name": name, "model": name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}


def card_for(location: Path) -> ModelCard:
    """The card of a GGUF file or model directory (a converted directory: the GGUF file it came from)."""
    source = gguf_source(location) if location.is_dir() else None
    path = source or location
    stat = path.stat()
    return _card(path, stat.st_mtime_ns, stat.st_size if path.is_file() else 0)


@lru_cache(maxsize=64)  # /api/tags is polled; a file's header is read once per version of it
def _card(path: Path, modified_ns: int, size: int) -> ModelCard:
    modified = datetime.fromtimestamp(modified_ns / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if path.is_file():
        return _gguf_card(path, size, modified)
    architecture, _, dtype = directory_facts(path)
    config = (path / "config.json").read_bytes()
    template = _directory_template(path)
    details = _details("safetensors", architecture, "?", dtype)
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return ModelCard(path, total, hashlib.sha256(config).hexdigest(), modified, details, json.loads(config),
                     template, _capabilities(template, _directory_vocabulary(path)))


def _gguf_card(path: Path, size: int, modified: str) -> ModelCard:
    reader = GgufFile(path)
    architecture = str(reader.field("general.architecture", "?"))
    parameters = sum(math.prod(tensor.shape) for tensor in reader.tensors)
    file_type = reader.field("general.file_type")
    try:
        quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else "?"
    except ValueError:
        quantization = f"type {file_type}"
    label = reader.field("general.size_label") or (f"{parameters / 1e9:.1f}B" if parameters >= 1e9
                                                   else f"{parameters / 1e6:.0f}M")
    info = {key: ([] if isinstance(value, SkippedArray) else value) for key, value in reader.fields.items()
            if key != "tokenizer.chat_template"}
    info.setdefault("general.parameter_count", parameters)
    template = str(reader.field("tokenizer.chat_template", ""))
    try:
        vocabulary = set(reader.strings("tokenizer.ggml.tokens"))
    except SpecdecError:
        vocabulary = set()
    return ModelCard(path, size, _digest(path), modified, _details("gguf", architecture, str(label), quantization),
                     info, template, _capabilities(template, vocabulary), str(reader.field("general.license", "")))


def _details(file_format: str, family: str, parameters: str, quantization: str) -> dict:
    return {"parent_model": "", "format": file_format, "family": family, "families": [family],
            "parameter_size": parameters, "quantization_level": quantization}


def _digest(path: Path) -> str:
    """Ollama's digest where the file is a blob of its store (named by it) or a pulled zoo file (its manifest
    holds the sha256); else a digest of the content key (sizes and sampled bytes, not the whole file's hash)."""
    if path.name.startswith("sha256-"):
        return path.name.removeprefix("sha256-")
    manifest = path.parent / "manifest.json"
    if manifest.is_file():
        recorded = json.loads(manifest.read_text())
        if recorded.get("gguf") == path.name:
            return recorded["sha256"]
    from specdec.models.sources.content_key import gguf_content_key

    return hashlib.sha256(gguf_content_key(path).encode()).hexdigest()


def _directory_template(path: Path) -> str:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    config = path / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else ""


def _directory_vocabulary(path: Path) -> set[str]:
    tokenizer = path / "tokenizer.json"
    if not tokenizer.is_file():
        return set()
    data = json.loads(tokenizer.read_text())
    return {token["content"] for token in data.get("added_tokens", [])}


def _capabilities(template: str, vocabulary: set[str]) -> tuple[str, ...]:
    """completion always; tools where the chat template writes Hermes-style calls; thinking where it writes
    <think> blocks; insert where the vocabulary has fill-in-the-middle tokens (/api/generate's suffix)."""
    found = ["completion"]
    found += ["tools"] if template_speaks_hermes(template) else []
    found += ["thinking"] if "<think>" in template or "<|channel|>" in template else []
    found += ["insert"] if any({f.prefix, f.suffix, f.middle} <= vocabulary for f in KNOWN_FORMATS) else []
    return tuple(found)


def expires_at(wall_time: float) -> str:
    if math.isinf(wall_time):
        return FOREVER
    return datetime.fromtimestamp(wall_time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
