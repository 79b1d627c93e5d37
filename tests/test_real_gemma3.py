"""Checks on the real Gemma 3 270M (slow: a 253 MB GGUF file, 1.1 GB as float32): the native decoder
against transformers past the 512-token sliding window, and greedy speculation equal to plain decoding on
the file's own blocks."""

import pytest
import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model

pytestmark = pytest.mark.slow

CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
'''


def long_text(tokenizer, length: int) -> list[int]:
    """A prose-and-code text of exactly `length` tokens (past the 512-token window of the local layers)."""
    paragraph = ("The committee met on Tuesday to discuss the budget for the new library. " * 3
                 + "def area(radius):\n    return 3.14159 * radius ** 2\n\n")
    ids = tokenizer.encode(paragraph * 40, add_special_tokens=True)
    assert len(ids) >= length
    return ids[:length]


def test_native_logits_equal_transformers_past_the_window(gemma3):
    """float32 on the packed kernel vs transformers on the same (dequantized) weights, over 560 tokens: the
    last 48 rows attend through the window on 15 of the 18 layers."""
    native = load_model(str(gemma3.path), weights="float32")
    reference = load_model(str(gemma3.path), backend="transformers")
    ids = torch.tensor([long_text(gemma3.tokenizer, 560)])
    positions = positions_after(0, ids.shape[1], 1, "cpu")
    ours = native.model.forward(ids, positions, native.model.new_cache(1, 600)).logits
    theirs = reference.model.forward(ids, positions, reference.model.new_cache(1, 600)).logits
    # 18 float32 layers summed in another order than the BLAS transformers calls (which picks its kernels by the
    # CPU and the libraries installed: 0.8e-3 to 3.7e-3 seen across machines and installs), logits of ~30-40; a
    # wrong window is off by units
    assert (ours - theirs).abs().max() < 2e-4 * theirs.abs().max()
    assert torch.equal(ours[0].argmax(-1), theirs[0].argmax(-1))


@pytest.mark.parametrize("drafter", ["ngram", "layerskip:first:9"])
def test_greedy_speculation_equals_plain_on_its_gguf_blocks(gemma3, drafter):
    """Across the window's edge too: a 500-token prompt and 48 new tokens."""
    from specdec.drafters import make_drafter

    prompt = gemma3.tokenizer.decode(long_text(gemma3.tokenizer, 500)[1:]) + "\n" + CODE
    for text in (CODE, prompt):
        expected = SpeculativeGenerator(gemma3, None).generate(text, 48, chat=False).token_ids
        spec = make_drafter(drafter, gemma3, "cpu", "float32")
        result = SpeculativeGenerator(gemma3, spec, 4).generate(text, 48, chat=False)
        assert result.token_ids == expected, f"{drafter}: {text[:40]!r}"
        assert len(expected) == 48
    assert result.stats.drafted > 0
