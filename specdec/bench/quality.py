"""What a weight format costs in quality: perplexity and agreement with the float32 model.

A quantized model is its own target (speculation reproduces it exactly), so its quality is a property of
the format, measured here on text that ships with the machine: Python source (the stdlib's textwrap and
json modules) and prose (Spec-Bench questions). For each format: perplexity of the text, and how often
its top-1 next token equals the float32 model's, and the mean KL(float32 || format) per token.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import textwrap
from dataclasses import dataclass

import torch

from specdec.bench.tasks import SPEC_BENCH_TASKS, find_spec_bench, load_prompts
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model


@dataclass
class FormatQuality:
    weights: str
    text: str
    perplexity: float
    top1_agreement: float  # with the float32 model's argmax
    kl_from_float32: float  # mean over positions, nats


def sample_texts(tokenizer, tokens: int) -> dict[str, list[int]]:
    """The first `tokens` tokens of each text (prose only where the Spec-Bench questions are found)."""
    texts = {"code": inspect.getsource(textwrap) + inspect.getsource(json.decoder)}
    if find_spec_bench() is not None:
        texts["prose"] = "\n\n".join(p.prompt for p in load_prompts(list(SPEC_BENCH_TASKS), limit=4))
    return {name: tokenizer.encode(text, add_special_tokens=False)[:tokens] for name, text in texts.items()}


@torch.inference_mode()
def log_probs(model, ids: list[int]) -> torch.Tensor:
    """(n - 1, V) log-probabilities of each next token, one prefill forward."""
    tokens = torch.tensor([ids])
    logits = model.forward(tokens, positions_after(0, len(ids), 1, tokens.device), model.new_cache(1, len(ids))).logits
    return torch.log_softmax(logits[0, :-1].float(), dim=-1)


def measure(model_name: str, formats: list[str], tokens: int) -> list[FormatQuality]:
    rows, reference = [], {}
    for weights in ["float32"] + [f for f in formats if f != "float32"]:
        loaded = load_model(model_name, weights=weights)
        for name, ids in sample_texts(loaded.tokenizer, tokens).items():
            lp = log_probs(loaded.model, ids)  # (n - 1, V)
            targets = torch.tensor(ids[1:])
            nll = -lp.gather(1, targets[:, None]).mean().item()
            if weights == "float32":
                reference[name] = lp
            ref = reference[name]
            agreement = (lp.argmax(-1) == ref.argmax(-1)).float().mean().item()
            kl = (ref.exp() * (ref - lp)).sum(-1).mean().item()
            if weights in formats:
                rows.append(FormatQuality(weights, name, math.exp(nll), agreement, kl))
        del loaded
    return rows


def main(argv: list[str] | None = None) -> None:
    """python -m specdec.bench.quality MODEL... [--formats float32,int8,int4,int7] [--tokens 1024]"""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--formats", default="float32,int8,int4,int7")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens of each text")
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    print("| model | weights | text | perplexity | top-1 = float32's | KL from float32 (nats/token) |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        for row in measure(name, formats, args.tokens):
            print(f"| {name} | {row.weights} | {row.text} | {row.perplexity:.3f} | {row.top1_agreement:.1%} | "
                  f"{row.kl_from_float32:.4f} |", flush=True)


if __name__ == "__main__":
    main()
