"""How often a draft model in fewer bits still picks its target's greedy token (teacher-forced), before any
kernel is written for such a format: the draft's layer matrices are quantized and dequantized in torch
(round to nearest, per output row and group of G inputs), then one float forward over prompt + answer is
compared with the target's own greedy answer, position by position.

    python scripts/lab/draft_quant_agreement.py   # 1.5B answers, 0.5B draft, 5 tasks x 4 prompts, 128 tokens

Formats ("bits:group" then "sym" or "asym", "+search"): sym stores one float16 scale a group, codes
-2^(b-1)..2^(b-1)-1 as our int4 (3-bit g32: 3.5 bits a weight, g64: 3.25); asym a float16 scale and minimum,
codes 0..2^b-1 (3-bit g32: 4.0 bits, as many as int4:128's 4.125). +search tries shrunken ranges and keeps
each group's least squared error (as llama.cpp's quantizers do). `int4:G` is the library's own int4
(kernels.layouts.quantize_grouped), what `weights=int4:G` runs. "mlp=A,attn=B" mixes two formats.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.bench.tasks import load_prompts
from specdec.kernels.layouts import dequantize_grouped, quantize_grouped
from specdec.models.adapters import merge_lora
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model

FORMATS = ("float;int4:128;int3:32 sym;int3:32 sym+search;int3:64 sym+search;int3:32 asym+search;"
           "int3:64 asym+search;int2:32 asym+search;mlp=int3:32 sym+search,attn=int4:128;"
           "mlp=int2:32 asym+search,attn=int4:128")


def round_groups(weight: torch.Tensor, bits: int, group: int, symmetric: bool, search: bool) -> torch.Tensor:
    """(N, K) -> the (N, K) values its b-bit codes stand for; with `search`, each group's range is the shrink
    of least squared error."""
    rows, cols = weight.shape
    groups = weight.float().view(rows, cols // group, group)  # (N, K/G, G)
    if symmetric:
        extreme = groups.gather(2, groups.abs().argmax(2, keepdim=True))
        shrinks = [(0.02 * i, 0.0) for i in range(15 if search else 1)]
    else:
        low, high = groups.amin(2, keepdim=True), groups.amax(2, keepdim=True)
        shrinks = [(0.02 * a, 0.02 * b) for a in range(8 if search else 1) for b in range(8 if search else 1)]
    best, best_error = None, None
    for shrink_low, shrink_high in shrinks:
        if symmetric:
            scale = (extreme * (1 - shrink_low) / -(2 ** (bits - 1))).half().float()
            codes = torch.round(groups / torch.where(scale != 0, scale, 1.0)).clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            values = codes * scale
        else:
            lowest = low + (high - low) * shrink_low
            scale = ((high - (high - low) * shrink_high - lowest) / (2 ** bits - 1)).half().float()
            lowest = lowest.half().float()
            codes = torch.round((groups - lowest) / torch.where(scale > 0, scale, 1.0)).clamp(0, 2 ** bits - 1)
            values = codes * scale + lowest
        error = ((values - groups) ** 2).sum(2, keepdim=True)
        if best is None:
            best, best_error = values, error
        else:
            best, best_error = torch.where(error < best_error, values, best), torch.minimum(error, best_error)
    return best.view(rows, cols)


def requantized(weight: torch.Tensor, form: str) -> torch.Tensor:
    """The values `weight` (N, K) holds in `form` (see the module docstring)."""
    if form == "float":
        return weight
    name, _, options = form.partition(" ")
    bits, group = int(name[3]), int(name.split(":")[1])
    if not options:  # the library's own format
        packed, scales = quantize_grouped(weight, group, bits)
        return dequantize_grouped(packed, scales, weight.shape[1])[: weight.shape[0]]
    return round_groups(weight, bits, group, options.startswith("sym"), options.endswith("+search"))


def quantize_layers(model, form: str) -> None:
    parts = dict(part.split("=") for part in form.split(",")) if "=" in form else {"mlp": form, "attn": form}
    for layer in model.model.layers:
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.data = requantized(module.weight.data, parts["mlp" if "mlp" in name else "attn"])


def agreement(model, answers: list[tuple[str, list[int], list[int]]]) -> dict[str, tuple[int, int]]:
    """task -> (positions where the draft's argmax is the target's token, positions)."""
    counts = defaultdict(lambda: (0, 0))
    with torch.no_grad():
        for task, prompt, answer in answers:
            ids = torch.tensor([prompt + answer[:-1]])
            logits = model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), model.new_cache(1, ids.shape[1])).logits
            picked = logits[0, len(prompt) - 1:].argmax(-1)  # (len(answer),)
            agreed, total = counts[task]
            counts[task] = (agreed + int((picked == torch.tensor(answer)).sum()), total + len(answer))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tasks", default="translation,qa,mt_bench,math_reasoning,code")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--formats", default=FORMATS, help="separated by ';'")
    parser.add_argument("--adapter", action="append", default=[],
                        help="a LoRA adapter directory merged into the draft before quantizing; repeat to compare "
                             "several (each format is measured without one, then with each)")
    args = parser.parse_args()
    plain = SpeculativeGenerator.from_pretrained(args.target, drafter="none")
    answers = []
    for prompt in load_prompts(args.tasks.split(","), args.limit):
        request = GenerationRequest(prompt=prompt.prompt, max_new_tokens=args.max_new_tokens, chat=prompt.chat)
        answers.append((prompt.task, plain.prompt_ids(request), plain.run(request).token_ids))
    del plain
    for form in args.formats.split(";"):
        for adapter in [None, *args.adapter]:
            start = time.perf_counter()
            draft = load_model(args.draft, kernels=False).model  # float32 torch layers, quantized below
            if adapter is not None:
                draft = merge_lora(draft, adapter)
            quantize_layers(draft, form)
            counts = agreement(draft, answers)
            overall = sum(a for a, _ in counts.values()) / sum(n for _, n in counts.values())
            label = form + (f" + {adapter}" if adapter else "")
            print(f"{label}: {overall:.3f} (" + ", ".join(f"{task} {a / n:.3f}" for task, (a, n) in counts.items())
                  + f"; {time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
