"""The target's own answers, generated in batches, with their features recorded on the way.

Answers to instructions are what a drafter meets at inference, so most of the training data is the
target talking: a batch of left-padded prompts is decoded together (the small-row kernel makes 16
rows cost little more than one), and every forward's final normed hidden states and top-8 next-token
probabilities are kept, so these tokens need no second feature pass. Half the batches decode greedily,
half at temperature 0.7, for variety.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specdec.training.corpus import chat_ids
from specdec.training.features import TOP_K, joined_features


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, eos_ids: tuple[int, ...],
                   temperature: float, generator: torch.Generator,
                   layers: tuple[int, ...] | None = None) -> list[dict[str, torch.Tensor]]:
    """Per prompt: tokens (n,), features (n, C x layers) float16, top_ids (n, 8), top_probs (n, 8) for
    prompt + answer (cut after EOS), where feature i is the target's state after token i at `layers`
    (None: the final normed state)."""
    layers = layers or (model.num_layers,)
    batch, longest = len(prompts), max(map(len, prompts))
    pads = torch.tensor([longest - len(p) for p in prompts])
    total = longest + max_new_tokens
    tokens = torch.zeros(batch, longest, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, longest - len(prompt):] = torch.tensor(prompt)
    columns = torch.arange(total)
    valid = columns.unsqueeze(0) >= pads.unsqueeze(1)  # (B, S): padding slots are never attended to
    cache = model.new_cache(batch, total)
    # Prefill: causal over real tokens; a padding row sees itself only (a row seeing nothing gives NaN).
    causal = torch.ones(longest, longest, dtype=torch.bool).tril()
    mask = (causal & valid[:, None, :longest]) | torch.eye(longest, dtype=torch.bool)  # (B, P, P)
    positions = (torch.arange(longest).unsqueeze(0) - pads.unsqueeze(1)).clamp_min(0)  # (B, P)
    out = model.forward(tokens, positions, cache, attn_mask=mask, hidden_layers=layers)
    features = [joined_features(out, layers)]  # list of (B, T, C x layers)
    # Each forward's top-8 law at once: keeping every step's (B, V) logits for the end held gigabytes at a
    # 150k-token vocabulary (16 answers of 200 tokens: 2.6 GB of logits, as much again for their softmax).
    tops = [torch.softmax(out.logits, dim=-1).topk(TOP_K, dim=-1)]  # list of ((B, T, 8) probs, ids)
    last = out.logits[:, -1]  # (B, V)
    generated = []
    for step in range(max_new_tokens):
        if temperature > 0:
            choice = torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=generator)[:, 0]
        else:
            choice = last.argmax(-1)
        generated.append(choice)
        if step + 1 == max_new_tokens:
            break
        stop = longest + step + 1
        out = model.forward(choice.unsqueeze(1), (longest - pads + step).unsqueeze(1), cache,
                            attn_mask=valid[:, None, :stop], hidden_layers=layers)
        features.append(joined_features(out, layers))
        tops.append(torch.softmax(out.logits, dim=-1).topk(TOP_K, dim=-1))
        last = out.logits[:, -1]
    all_features = torch.cat(features, dim=1)  # (B, P + new - 1, C)
    top_probs = torch.cat([probs for probs, _ in tops], dim=1)  # (B, P + new - 1, 8)
    top_ids = torch.cat([ids for _, ids in tops], dim=1)
    answers = torch.stack(generated, dim=1)  # (B, new)
    results = []
    for row in range(batch):
        answer = answers[row].tolist()
        ends = [i for i, t in enumerate(answer) if t in eos_ids]
        keep_answer = ends[0] + 1 if ends else len(answer)
        start = int(pads[row])
        count = longest - start + keep_answer - 1  # tokens whose feature was computed
        sequence = torch.tensor(prompts[row] + answer[:keep_answer])[:count]
        results.append({"tokens": sequence.to(torch.int32),
                        "features": all_features[row, start: start + count].to(torch.float16),
                        "top_ids": top_ids[row, start: start + count].to(torch.int32),
                        "top_probs": top_probs[row, start: start + count].to(torch.float16)})
    return results


GENERATION_BATCH = 16


def generated_features(target, prompts: list[str], max_new_tokens: int, out_dir: Path, seed: int,
                       progress: bool = True, layers: tuple[int, ...] | None = None) -> list[dict[str, torch.Tensor]]:
    """The target's answers to `prompts` with their features (`generate_batch`), in batches cached as
    shards under out_dir like the corpus features."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = target.model, target.tokenizer
    batches = [prompts[i: i + GENERATION_BATCH] for i in range(0, len(prompts), GENERATION_BATCH)]
    sequences: list[dict[str, torch.Tensor]] = []
    for index, batch in enumerate(tqdm(batches, desc="self-generated answers", unit="batch", disable=not progress)):
        path = out_dir / f"generated-{index:05d}.safetensors"
        if not path.exists():
            prompt_ids = [chat_ids(tokenizer, text) for text in batch]
            generator = torch.Generator().manual_seed(seed * 100_003 + index)
            results = generate_batch(model, prompt_ids, max_new_tokens, target.eos_token_ids,
                                     0.0 if index % 2 == 0 else 0.7, generator, layers)
            flat = {key: torch.cat([r[key] for r in results]) for key in results[0]}
            flat["lengths"] = torch.tensor([r["tokens"].shape[0] for r in results], dtype=torch.int64)
            partial = path.with_suffix(".partial")
            save_file(flat, str(partial))
            partial.replace(path)
        flat = load_file(str(path))
        bounds = [0, *flat.pop("lengths").cumsum(0).tolist()]
        for start, stop in zip(bounds, bounds[1:]):
            sequences.append({key: value[start:stop] for key, value in flat.items()})
    return sequences
