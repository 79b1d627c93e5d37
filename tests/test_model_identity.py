"""A GGUF file is known by its content, not its path: a renamed or copied file reuses its conversion and
packed-weight caches, and a copy of a pulled zoo model's file is that zoo model (its name, its default
drafter, its caches). The content key tells files apart that share a header but not their weights."""

from __future__ import annotations

import json
import shutil

import pytest

from specdec.models.quantized.packed_cache import packed_cache_path
from specdec.models.sources import content_key, gguf_convert, loading
from specdec.models.sources.content_key import gguf_content_key, zoo_name_of
from specdec.paths import models_dir
from tiny_models import make_hf_model, write_tiny_gguf


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_tiny_gguf(tmp_path / "tiny-model-Q8_0.gguf", make_hf_model("qwen2", seed=7), "Q8_0")


def test_a_renamed_copy_reuses_the_conversion_and_the_packed_cache(tmp_path, tiny_gguf, monkeypatch):
    name, first = loading.resolve_model_dir(str(tiny_gguf))
    assert name == "tiny-model-Q8_0"
    packed = packed_cache_path(first, "int8")
    copy = shutil.copy(tiny_gguf, tmp_path / "renamed.gguf")
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a: pytest.fail("converted the same bytes again"))
    name, second = loading.resolve_model_dir(str(copy))
    assert second == first and name == "renamed"
    assert json.loads((second / "specdec_source.json").read_text())["gguf"] == str(copy.resolve())
    tiny_gguf.unlink()  # the first path gone: the directory now names the copy, which it reads
    assert packed_cache_path(second, "int8") == packed  # keyed by content, not by the file's name or time


def test_files_sharing_a_header_but_not_their_weights_have_different_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(content_key, "HEAD_BYTES", 4096)  # as a large file: the header whole, the weights sampled
    monkeypatch.setattr(content_key, "SAMPLE_BYTES", 256)
    model = make_hf_model("qwen2", seed=7)
    one = write_tiny_gguf(tmp_path / "one.gguf", model, "F32")
    for parameter in model.parameters():  # the same architecture and vocabulary, other weights
        parameter.data.add_(0.01)
    two = write_tiny_gguf(tmp_path / "two.gguf", model, "F32")
    assert one.stat().st_size == two.stat().st_size
    assert one.read_bytes()[:4096] == two.read_bytes()[:4096]
    assert gguf_content_key(one) != gguf_content_key(two)
    assert gguf_content_key(shutil.copy(one, tmp_path / "three.gguf")) == gguf_content_key(one)


def test_a_copy_of_a_zoo_models_file_is_that_zoo_model(tmp_path, tiny_gguf):
    zoo_dir = models_dir() / "smollm2-135m-instruct"
    zoo_dir.mkdir(parents=True)
    shutil.copy(tiny_gguf, zoo_dir / "smollm2-135m-instruct.gguf")
    gguf_convert.convert_gguf(zoo_dir / "smollm2-135m-instruct.gguf", zoo_dir / "hf")
    (zoo_dir / "manifest.json").write_text(json.dumps({"name": "smollm2-135m-instruct",
                                                      "gguf": "smollm2-135m-instruct.gguf"}))
    downloaded = shutil.copy(tiny_gguf, tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert zoo_name_of(downloaded) == "smollm2-135m-instruct"
    assert loading.resolve_model_dir(str(downloaded)) == ("smollm2-135m-instruct", zoo_dir / "hf")
    other = write_tiny_gguf(tmp_path / "other.gguf", make_hf_model("qwen2", seed=8), "Q8_0")
    assert zoo_name_of(other) is None
