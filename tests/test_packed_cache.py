"""Low-bit packings saved once and read back (models/quantized/packed_cache.py): the same model, no re-quantization,
one file shared by a --weights target and a quant: self-draft, damaged or stale files rebuilt."""

import gc
import os
import weakref

import pytest
import torch

from specdec import kernels
from specdec.drafters import make_drafter
from specdec.api.generator import SpeculativeGenerator
from specdec.models.quantized import packed_cache
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.models.quantized.gguf_matrices import GgufMatrices
from specdec.models.quantized.packed_cache import PackedCacheWriter, packed_cache_path
from specdec.models.quantized.packed_linear import PackedLinear
from tiny_models import make_hf_model, save_tiny_model, write_tiny_gguf

pytestmark = pytest.mark.skipif(kernels.packed_kernel() is None, reason="needs the CPU kernel")


@pytest.fixture(params=[("qwen2", "int4"), ("llama", "int8"), ("qwen2", "int7:64")], ids=["int4", "int8", "int7:64"])
def checkpoint(request, tmp_path):
    kind, weights = request.param  # the tiny llama ties its embeddings; the tiny qwen2 has q/k/v biases
    return save_tiny_model(tmp_path / kind, kind, seed=41), weights


def logits(model) -> torch.Tensor:
    tokens = torch.arange(5, 25).unsqueeze(0)
    return model.forward(tokens, positions_after(0, 20, 1, "cpu"), model.new_cache(1, 32)).logits


def forbid_quantizing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("quantized again although a packing was cached")
    monkeypatch.setattr("specdec.models.quantized.packed_linear.quantize_grouped", refuse)
    monkeypatch.setattr("specdec.models.quantized.packed_linear.quantize_packed_int8", refuse)


def test_second_load_reads_the_packing_and_computes_the_same(checkpoint, monkeypatch):
    path, weights = checkpoint
    first = load_model(str(path), weights=weights)
    cache = packed_cache_path(path, weights)
    assert cache.exists() and not any(p.name.endswith(".partial") for p in cache.parent.iterdir())
    forbid_quantizing(monkeypatch)
    second = load_model(str(path), weights=weights)
    assert second.model.weight_format == first.model.weight_format
    assert torch.equal(logits(second.model), logits(first.model))


def test_a_self_draft_shares_the_targets_packing(checkpoint, monkeypatch):
    path, weights = checkpoint
    quantized = load_model(str(path), weights=weights)  # writes the packing
    forbid_quantizing(monkeypatch)
    target = load_model(str(path))  # float32
    drafter = make_drafter(f"quant:{weights}", target, "cpu", "float32")
    assert torch.equal(logits(drafter.model), logits(quantized.model))
    prompt = "hello hello the world"
    expected = SpeculativeGenerator(target, None).generate(prompt, 24, chat=False).token_ids
    assert SpeculativeGenerator(target, drafter, 3).generate(prompt, 24, chat=False).token_ids == expected


def test_a_draft_made_first_writes_the_packing_a_target_reads(tmp_path, monkeypatch):
    path = save_tiny_model(tmp_path / "m", "qwen2", seed=42)
    drafter = make_drafter("quant:int4", load_model(str(path)), "cpu", "float32")
    assert packed_cache_path(path, "int4").exists()
    forbid_quantizing(monkeypatch)
    assert torch.equal(logits(load_model(str(path), weights="int4").model), logits(drafter.model))


def test_damaged_or_stale_packings_are_rebuilt(tmp_path):
    path = save_tiny_model(tmp_path / "m", "qwen2", seed=43)
    reference = logits(load_model(str(path), weights="int4").model)
    cache = packed_cache_path(path, "int4")
    cache.write_bytes(cache.read_bytes()[:1000])  # truncated
    with pytest.warns(RuntimeWarning, match="damaged"):
        again = load_model(str(path), weights="int4")
    assert torch.equal(logits(again.model), reference) and cache.stat().st_size > 1000
    weights_file = next(path.glob("*.safetensors"))
    os.utime(weights_file, ns=(weights_file.stat().st_atime_ns, weights_file.stat().st_mtime_ns + 10**9))
    assert packed_cache_path(path, "int4") != cache  # a changed checkpoint gets its own packing


def test_an_unwritable_cache_only_warns(tmp_path, monkeypatch):
    path = save_tiny_model(tmp_path / "m", "llama", seed=44)
    gguf_file = write_tiny_gguf(tmp_path / "q.gguf", make_hf_model("qwen2", seed=44), "Q8_0")
    add = PackedCacheWriter.add

    def full_disk_after_one_layer(self, name, layer):
        if self.entries:
            raise OSError("No space left on device")
        add(self, name, layer)
    with monkeypatch.context() as patch:
        patch.setattr(PackedCacheWriter, "add", full_disk_after_one_layer)
        with pytest.warns(RuntimeWarning, match="could not cache"):
            loaded = load_model(str(path), weights="int4")
        assert loaded.model.weight_format == "int4"
        assert not list(packed_cache_path(path, "int4").parent.glob("*"))  # nothing half-written
        # a GGUF file's blocks, packed straight into the cache on a first load, are kept in memory instead
        with pytest.warns(RuntimeWarning, match="could not cache"):
            blocks = load_model(str(gguf_file), weights="gguf")
    assert torch.equal(logits(blocks.model), logits(load_model(str(gguf_file), weights="gguf").model))
    assert [p.name for p in packed_cache_path(blocks.path, "gguf").parent.iterdir()] == [
        packed_cache_path(blocks.path, "gguf").name]


def packed_layers(seed: int) -> dict[str, PackedLinear]:
    """Layers in several formats and buffer types (int4 codes and scales, a bias, bf16 and fp16 panels)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(24, 64, generator=generator)
    return {"a": PackedLinear(weight, torch.randn(24, generator=generator), [16, 8]).quantize_("int4"),
            "b": PackedLinear(weight, None, [24]).quantize_("bf16"),
            "c.d": PackedLinear(weight[:8], None, [8]).quantize_("fp16")}


@pytest.mark.parametrize("room", [PackedCacheWriter.HEADER_ROOM, 64], ids=["header-in-its-room", "header-outgrows-it"])
def test_layers_written_one_at_a_time_read_back_as_written(tmp_path, monkeypatch, room):
    monkeypatch.setattr(PackedCacheWriter, "HEADER_ROOM", room)
    layers, path = packed_layers(7), tmp_path / "cache" / "x.safetensors"
    assert packed_cache.write_packed(iter(layers.items()), path)
    assert list(path.parent.iterdir()) == [path]
    read = packed_cache.load_packed(path)
    assert read.keys() == layers.keys()
    for name, layer in layers.items():
        assert read[name].layout() == layer.layout()
        assert read[name]._buffers.keys() == layer._buffers.keys()
        for key, buffer in layer._buffers.items():
            assert (buffer is None and read[name]._buffers[key] is None) or (
                buffer.dtype == read[name]._buffers[key].dtype and torch.equal(buffer, read[name]._buffers[key]))
    x = torch.randn(3, 64)
    assert all(torch.equal(read[name].unsplit(x), layer.unsplit(x)) for name, layer in layers.items())


def test_a_failed_write_leaves_nothing(tmp_path):
    def layers_then_a_fault():
        yield "a", packed_layers(8)["a"]
        raise ValueError("a matrix the kernels cannot take")
    with pytest.raises(ValueError, match="cannot take"):
        packed_cache.write_packed(layers_then_a_fault(), tmp_path / "cache" / "x.safetensors")
    assert not list((tmp_path / "cache").iterdir())


def test_a_first_gguf_load_holds_one_layer_at_a_time(tmp_path, monkeypatch):
    """A GGUF file's layers go to the cache as they are packed: when a layer is written, no earlier one lives."""
    path = write_tiny_gguf(tmp_path / "t.gguf", make_hf_model("llama", seed=45, tie_word_embeddings=False), "Q8_0")
    written, add = [], PackedCacheWriter.add

    def add_and_watch(self, name, layer):
        gc.collect()
        assert [name for name, ref in written if ref() is not None] == []
        written.append((name, weakref.ref(layer)))
        add(self, name, layer)
    with monkeypatch.context() as patch:
        patch.setattr(PackedCacheWriter, "add", add_and_watch)
        model = load_model(str(path), weights="gguf").model
    assert len(written) == 4 * 2 + 2  # 2 decoder layers' 4 matrices, the LM head, the untied embeddings
    assert GgufMatrices(path).most_layers() >= len(written)  # the header's room is asked for enough
    with torch.no_grad():
        assert torch.equal(logits(model), logits(load_model(str(path), weights="gguf").model))
