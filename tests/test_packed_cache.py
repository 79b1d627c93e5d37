"""Low-bit packings saved once and read back (models/quantized/packed_cache.py): the same model, no re-quantization,
one file shared by a --weights target and a quant: self-draft, damaged or stale files rebuilt."""

import os

import pytest
import torch

from specdec import kernels
from specdec.drafters import make_drafter
from specdec.api.generator import SpeculativeGenerator
from specdec.models.quantized import packed_cache
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.models.quantized.packed_cache import packed_cache_path
from tiny_models import save_tiny_model

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

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")
    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    with pytest.warns(RuntimeWarning, match="could not cache"):
        loaded = load_model(str(path), weights="int4")
    assert loaded.model.weight_format == "int4"
    assert not list(packed_cache_path(path, "int4").parent.glob("*"))  # nothing half-written
