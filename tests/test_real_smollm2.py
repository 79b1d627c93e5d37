"""Checks on the real SmolLM2-135M-Instruct (slow: a 540 MB float32 model)."""

import pytest
import torch

from specdec.commit import StopCriteria
from specdec.engine import SpeculativeEngine
from specdec.models.base import positions_after
from specdec.models.loading import load_model
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]


def prompt_ids(loaded) -> list[int]:
    ids = loaded.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_native_logits_equal_transformers(smollm2):
    hf = load_model(str(smollm2.path), backend="transformers")
    ids = torch.tensor([prompt_ids(smollm2)])
    native = smollm2.model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), smollm2.model.new_cache(1, 128))
    reference = hf.model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), hf.model.new_cache(1, 128))
    assert (native.logits - reference.logits).abs().max() < 1e-4


def test_greedy_generation_equals_transformers_generate(smollm2):
    from transformers import AutoModelForCausalLM

    ids = prompt_ids(smollm2)
    engine = SpeculativeEngine(smollm2.model)
    ours = engine.generate(ids, SamplingParams(), StopCriteria(24, frozenset(smollm2.eos_token_ids)),
                           smollm2.tokenizer).token_ids
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2.path)).eval()
    reference = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    assert ours == reference[: len(ours)]
    assert len(ours) == 24
