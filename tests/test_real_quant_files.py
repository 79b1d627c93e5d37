"""Real GGUF files of the quant types llama.cpp's quantize presets produce, made from the zoo's SmolLM2-135M
by llama.cpp's own `llama-quantize` (from $SPECDEC_LLAMA_CPP or PATH; skipped without it), cached under
$SPECDEC_TEST_CACHE (default ~/.cache/specdec-test) and never committed. Each runs natively on its own
values (`--weights auto`), computes what the file dequantized computes, and speculates exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import REAL_SPECDEC_HOME
from specdec.api.generator import SpeculativeGenerator
from specdec.drafters.ngram import NgramDrafter
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model

pytestmark = pytest.mark.slow

# SmolLM2's rows (576 inputs) are no multiple of 256: its K-quant presets fall back to legacy types for most
# matrices (as for any such model); the K-quants themselves are covered by tiny files (test_gguf_blocks.py).
PRESETS = ["Q5_1", "IQ4_NL", "Q3_K_M", "Q5_K_M", "F16", "BF16"]


def quantize_program() -> Path | None:
    folder = os.environ.get("SPECDEC_LLAMA_CPP")
    if folder and (Path(folder) / "llama-quantize").is_file():
        return Path(folder) / "llama-quantize"
    found = shutil.which("llama-quantize")
    return Path(found) if found else None


@pytest.fixture(scope="module")
def quantized_files() -> dict[str, Path]:
    program = quantize_program()
    source = REAL_SPECDEC_HOME / "models" / "smollm2-135m-instruct" / "smollm2-135m-instruct.gguf"
    if program is None or not source.is_file():
        pytest.skip("needs llama.cpp's llama-quantize ($SPECDEC_LLAMA_CPP or PATH) and the pulled SmolLM2-135M")
    cache = Path(os.environ.get("SPECDEC_TEST_CACHE") or Path.home() / ".cache" / "specdec-test") / "quants"
    cache.mkdir(parents=True, exist_ok=True)
    files = {}
    for preset in PRESETS:
        path = cache / f"smollm2-135m-{preset}.gguf"
        if not path.exists():
            partial = path.with_suffix(".partial")
            subprocess.run([str(program), "--allow-requantize", str(source), str(partial), preset, "2"],
                           check=True, capture_output=True)
            partial.rename(path)
        files[preset] = path
    return files


@pytest.mark.parametrize("preset", PRESETS)
def test_a_real_quantized_file_runs_natively_and_speculates_exactly(quantized_files, preset):
    path = str(quantized_files[preset])
    native = load_model(path, weights="auto")
    assert native.model.layers_are_packed() and native.model.weight_format in ("gguf", "fp16", "bf16")
    tokens = torch.tensor([native.tokenizer.encode("def fibonacci(n):\n    ")])
    with torch.no_grad():
        ours = native.model.forward(tokens, positions_after(0, tokens.shape[1], 1, "cpu"),
                                    native.model.new_cache(1, 64)).logits
        exact = load_model(path, weights="float32")  # the file's values, dequantized by gguf-py
        reference = exact.model.forward(tokens, positions_after(0, tokens.shape[1], 1, "cpu"),
                                        exact.model.new_cache(1, 64)).logits
    if preset in ("F16", "BF16"):  # panels of the file's type widened to float32: float32's arithmetic
        assert torch.equal(ours, reference)
    else:  # the same weights; only the activations' int8 rounding differs (per 256 inputs for the K-quants'
        # matrices, as llama.cpp rounds them: a feed-forward product's outliers cost a few percent)
        assert (ours - reference).norm() / reference.norm() < 0.1
        assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.8
    prompt = "Write a Python function that returns the squares of a list of numbers."
    plain = SpeculativeGenerator(native, None).generate(prompt, 48).token_ids
    assert SpeculativeGenerator(native, NgramDrafter(), 6).generate(prompt, 48).token_ids == plain
