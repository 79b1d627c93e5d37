"""What `specdec models --local` lists: every model found in the stores (stores.py) and the pulled zoo, each
described from its own header (architecture, parameters, quantization, size, tokenizer fingerprint), and
which of the others could draft for it (the same fingerprint, and at most half its bytes). A file
that cannot be read is listed with the reason, in one line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from gguf import LlamaFileType

from specdec.errors import SpecdecError
from specdec.models.fingerprint import tokenizer_fingerprint
from specdec.models.sources import stores, zoo
from specdec.models.sources.gguf_file import GgufFile

# A draft worth its cost weighs at most this share of its target's file: Qwen2.5-Coder-0.5B's file is 0.44 of
# the 1.5B's (its 151,936-row embedding is a third of it) and drafts for it in int4 with its head cut.
DRAFT_SIZE_SHARE = 0.5


@dataclass(frozen=True)
class LocalModel:
    name: str
    store: str
    path: Path
    size_bytes: int
    architecture: str = "?"
    parameters: str = "?"
    quantization: str = "?"
    fingerprint: str = ""  # tokenizer_fingerprint; "" when the model could not be read
    problem: str = ""  # why it could not be read


def found_models() -> list[stores.StoredModel]:
    """Everything the stores and the zoo hold (no reading of the files yet)."""
    found = _zoo() + _ollama() + _hf_cache() + _lmstudio() + _models_dir()
    return sorted(found, key=lambda model: (model.store, model.name))


def describe(model: stores.StoredModel) -> LocalModel:
    path = model.path
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    try:
        facts = gguf_facts(path) if path.is_file() else directory_facts(path)
        return LocalModel(model.name, model.store, path, size, *facts, fingerprint=tokenizer_fingerprint(path))
    except (SpecdecError, OSError, ValueError, KeyError) as error:
        return LocalModel(model.name, model.store, path, size, problem=str(error).splitlines()[0])


def draft_candidates(target: LocalModel, models: list[LocalModel]) -> list[LocalModel]:
    """The models whose token ids mean the target's and that weigh at most DRAFT_SIZE_SHARE of it."""
    return [m for m in models if m.fingerprint and m.fingerprint == target.fingerprint and m.path != target.path
            and m.size_bytes <= DRAFT_SIZE_SHARE * target.size_bytes]


def gguf_facts(path: Path) -> tuple[str, str, str]:
    reader = GgufFile(path)
    file_type = reader.field("general.file_type")
    try:
        quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else "?"
    except ValueError:
        quantization = f"type {file_type}"
    parameters = reader.field("general.size_label") or _count(sum(math.prod(t.shape) for t in reader.tensors))
    return str(reader.field("general.architecture", "?")), str(parameters), quantization


def directory_facts(path: Path) -> tuple[str, str, str]:
    config = json.loads((path / "config.json").read_text())
    return str(config.get("model_type", "?")), "?", str(config.get("torch_dtype") or config.get("dtype") or "?")


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.1f}B" if parameters >= 1e9 else f"{parameters / 1e6:.0f}M"


# -- what each store holds ------------------------------------------------------------------------------
def _zoo() -> list[stores.StoredModel]:
    return [stores.StoredModel(name, zoo.model_dir(name) / f"{name}.gguf", "zoo")
            for name in zoo.REGISTRY if zoo.is_pulled(name) and (zoo.model_dir(name) / f"{name}.gguf").is_file()]


def _ollama() -> list[stores.StoredModel]:
    root = stores.ollama_root() / "manifests"
    found = []
    for manifest in sorted(root.rglob("*")) if root.is_dir() else []:
        if not manifest.is_file():
            continue
        parts = manifest.relative_to(root).parts  # HOST/NAMESPACE/NAME/TAG
        host, *path, tag = parts
        if host == stores.OLLAMA_REGISTRY and path and path[0] == "library":
            path = path[1:]
        name = "/".join(path if host == stores.OLLAMA_REGISTRY else [host, *path]) + f":{tag}"
        try:
            found.append(stores.ollama_model(name))
        except SpecdecError:
            continue  # a manifest without a model layer (a projector, an adapter): not a model
    return found


def _hf_cache() -> list[stores.StoredModel]:
    root = stores.hf_hub_root()
    found = []
    for repo in sorted(root.glob("models--*--*")) if root.is_dir() else []:
        org, name = repo.name.removeprefix("models--").split("--", 1)
        snapshot = stores._main_snapshot(repo)
        if snapshot is None:
            continue
        if (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors")):
            found.append(stores.StoredModel(f"hf:{org}/{name}", snapshot, "hf"))
        found += [stores.StoredModel(f"hf:{org}/{name}/{g.relative_to(snapshot)}", g, "hf")
                  for g in sorted(snapshot.rglob("*.gguf"))]
    return found


def _lmstudio() -> list[stores.StoredModel]:
    found = []
    for root in stores.lmstudio_roots():
        for gguf in sorted(root.glob("*/*/**/*.gguf")) if root.is_dir() else []:
            found.append(stores.StoredModel(f"lmstudio:{gguf.relative_to(root)}", gguf, "lmstudio"))
    return found


def _models_dir() -> list[stores.StoredModel]:
    root = stores.models_dir_root()
    if root is None or not root.is_dir():
        return []
    found = [stores.StoredModel(g.stem, g, "models-dir") for g in sorted(root.glob("*.gguf"))]
    return found + [stores.StoredModel(d.name, d, "models-dir") for d in sorted(root.iterdir())
                    if d.is_dir() and (d / "config.json").is_file()]
