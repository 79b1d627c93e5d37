"""Models where users already keep them: Ollama's store, the Hugging Face cache, LM Studio's folder and a
models folder of one's own. Nothing here downloads: a store that is not there is simply absent.

Names:
  ollama:NAME[:TAG]          Ollama's manifest for NAME (TAG "latest" by default) -> its model layer's blob,
                             a GGUF file; the store is $OLLAMA_MODELS or ~/.ollama/models, as Ollama reads it
  hf:ORG/REPO[/FILE]         a repository in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or
                             ~/.cache/huggingface/hub), its main snapshot: a model directory, its one .gguf
                             file, or FILE
  lmstudio:PUBLISHER/REPO[/FILE]   LM Studio's models folder ($LMSTUDIO_MODELS, ~/.lmstudio/models or
                             ~/.cache/lm-studio/models), its one .gguf file or FILE
  NAME                       NAME.gguf (or a model directory NAME) in $SPECDEC_MODELS_DIR (--models-dir)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import UnknownModelError

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
PREFIXES = ("ollama:", "hf:", "lmstudio:")


@dataclass(frozen=True)
class StoredModel:
    name: str  # what the user calls it: "ollama:qwen2.5-coder:1.5b", "hf:Qwen/...", a models-dir stem
    path: Path  # a GGUF file (an Ollama blob has no .gguf suffix) or a Hugging Face model directory
    store: str  # "ollama", "hf", "lmstudio", "models-dir"


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def hf_hub_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def lmstudio_roots() -> list[Path]:
    given = os.environ.get("LMSTUDIO_MODELS")
    if given:
        return [Path(given).expanduser()]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def models_dir_root() -> Path | None:
    given = os.environ.get("SPECDEC_MODELS_DIR")
    return Path(given).expanduser() if given else None


def is_store_name(spec: str) -> bool:
    return spec.startswith(PREFIXES)


def resolve_store_name(spec: str) -> StoredModel | None:
    """The stored model a name means; None for a name no store claims (a zoo name, a path); UnknownModelError
    for a store name whose model is not there (one line saying where it looked)."""
    if spec.startswith("ollama:"):
        return ollama_model(spec.removeprefix("ollama:"))
    if spec.startswith("hf:"):
        return hf_cache_model(spec.removeprefix("hf:"))
    if spec.startswith("lmstudio:"):
        return lmstudio_model(spec.removeprefix("lmstudio:"))
    root = models_dir_root()
    if root is not None and "/" not in spec and not spec.endswith(".gguf"):
        for candidate in (root / f"{spec}.gguf", root / spec):
            if candidate.is_file() or (candidate / "config.json").is_file():
                return StoredModel(spec, candidate, "models-dir")
    return None


def ollama_manifest(name: str) -> Path:
    """NAME[:TAG] -> its manifest: library models under registry.ollama.ai/library, NAMESPACE/NAME under the
    registry, HOST/... (hf.co/ORG/REPO) under that host, as Ollama lays them out."""
    model, _, tag = name.partition(":")
    parts = model.split("/")
    if len(parts) == 1:
        parts = [OLLAMA_REGISTRY, "library", *parts]
    elif "." not in parts[0]:
        parts = [OLLAMA_REGISTRY, *parts]
    return ollama_root() / "manifests" / Path(*parts) / (tag or "latest")


def ollama_model(name: str) -> StoredModel:
    manifest = ollama_manifest(name)
    if not manifest.is_file():
        raise UnknownModelError(f"ollama:{name}: no such model in Ollama's store ({manifest} is missing; "
                                f"`ollama pull {name}` fetches it)")
    try:
        layers = json.loads(manifest.read_text()).get("layers") or []
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (ValueError, StopIteration, KeyError, AttributeError):
        raise UnknownModelError(f"ollama:{name}: its manifest {manifest} names no model layer") from None
    blob = ollama_root() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise UnknownModelError(f"ollama:{name}: its model blob {blob} is missing")
    return StoredModel(f"ollama:{name}", blob, "ollama")


def hf_cache_model(name: str) -> StoredModel:
    parts = name.split("/")
    if len(parts) < 2:
        raise UnknownModelError(f"hf:{name}: name a repository as hf:ORG/REPO[/FILE]")
    repo = hf_hub_root() / f"models--{parts[0]}--{parts[1]}"
    snapshot = _main_snapshot(repo)
    if snapshot is None:
        raise UnknownModelError(f"hf:{name}: not in the Hugging Face cache ({repo}; nothing is downloaded)")
    return StoredModel(f"hf:{name}", _model_in(snapshot, "/".join(parts[2:]), f"hf:{name}"), "hf")


def _main_snapshot(repo: Path) -> Path | None:
    ref = repo / "refs" / "main"
    snapshots = repo / "snapshots"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def _model_in(folder: Path, file: str, name: str) -> Path:
    """The model a folder holds: FILE, else the folder itself (a model directory), else its one .gguf file."""
    if file:
        if not (folder / file).is_file():
            raise UnknownModelError(f"{name}: no such file")
        return folder / file
    if (folder / "config.json").is_file():
        return folder
    ggufs = sorted(folder.rglob("*.gguf"))
    if len(ggufs) != 1:
        listed = ", ".join(str(g.relative_to(folder)) for g in ggufs) or "none"
        raise UnknownModelError(f"{name}: name one .gguf file of {listed}")
    return ggufs[0]


def lmstudio_model(name: str) -> StoredModel:
    parts = name.split("/")
    for root in lmstudio_roots():
        folder = root / Path(*parts[:2]) if len(parts) >= 2 else None
        if folder is not None and folder.is_dir():
            return StoredModel(f"lmstudio:{name}", _model_in(folder, "/".join(parts[2:]), f"lmstudio:{name}"),
                               "lmstudio")
    raise UnknownModelError(f"lmstudio:{name}: not in LM Studio's models folder "
                            f"({', '.join(str(root) for root in lmstudio_roots())})")
