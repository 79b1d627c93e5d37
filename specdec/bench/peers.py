"""What a user would run instead: transformers' `generate`, plain, with an assistant model,
and with prompt lookup, on the same weights and dtype, in the same process."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.models.sources.checkpoint import ensure_float32_weights


@dataclass
class PeerRun:
    new_tokens: int
    seconds: float
    token_ids: list[int] | None  # None where they are not comparable with ours (llama.cpp: other weights)


class TransformersPeer:
    """`mode`: "plain", "assisted" (needs assistant_dir; an assistant with another tokenizer runs as
    transformers' universal assisted generation) or "lookup" (prompt_lookup_num_tokens=10)."""

    def __init__(self, target_dir: Path, mode: str, assistant_dir: Path | None = None, device: str = "cpu",
                 dtype: str = "float32"):
        self.mode = mode
        self.model = _load(str(target_dir), device, dtype)
        self.assistant = _load(str(assistant_dir), device, dtype) if mode == "assisted" else None
        self.device = device
        self.tokenizers = None  # (target's, assistant's) where they differ: universal assisted generation
        if mode == "assisted":
            from transformers import AutoTokenizer

            tokenizers = AutoTokenizer.from_pretrained(str(target_dir)), AutoTokenizer.from_pretrained(str(assistant_dir))
            if tokenizers[0].get_vocab() != tokenizers[1].get_vocab():
                self.tokenizers = tokenizers

    @property
    def name(self) -> str:
        return {"plain": "hf-plain", "assisted": "hf-assisted", "lookup": "hf-lookup"}[self.mode]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: tuple[int, ...]) -> PeerRun:
        inputs = torch.tensor([prompt_ids], device=self.device)
        options = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_token_ids),
                       pad_token_id=eos_token_ids[0], attention_mask=torch.ones_like(inputs))
        if self.mode == "assisted":
            options["assistant_model"] = self.assistant
            if self.tokenizers is not None:
                options["tokenizer"], options["assistant_tokenizer"] = self.tokenizers
        elif self.mode == "lookup":
            options["prompt_lookup_num_tokens"] = 10
        start = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(inputs, **options)
        seconds = time.perf_counter() - start
        new = output[0, len(prompt_ids):].tolist()
        while new and new[-1] in eos_token_ids:  # count generated text, not the EOS marker, as we do
            new.pop()
        return PeerRun(len(new), seconds, new)


@functools.cache
def _load(path: str, device: str, dtype: str = "float32"):
    """One copy of each model, however many peers use it (a 1.5B float32 model is 6 GB)."""
    from transformers import AutoModelForCausalLM

    ensure_float32_weights(Path(path))
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
