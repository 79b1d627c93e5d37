"""How often a sampling draft model's token is kept under each exact rule, computed exactly per position
(no sampling noise, no timing): along texts the target samples, both models' processed distributions p
(target) and q (draft) at every position give

  rejection  1 - TV(p, q)                                the standard rule's acceptance
  match      |{u: invCDF_p(u) == invCDF_q(u)}|            the match rule with coupled inverse-CDF draws
  gumbel     sum_x 1 / sum_y max(p_y/p_x, q_y/q_x)        the match rule if both drew by Gumbel-max

    python scripts/lab/coupling_acceptance.py qwen2.5-coder-1.5b-instruct \\
        qwen2.5-coder-0.5b-instruct --draft-weights int4 --temperature 0.7
"""

import argparse
import statistics

import torch

from specdec.bench.tasks import load_prompts
from specdec.api.generator import SpeculativeGenerator
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams, processed_probs


def position_probs(model, ids: list[int], first: int, params: SamplingParams, vocab: int) -> torch.Tensor:
    """(len(ids) - first, V): the processed distribution after each of ids[first - 1:-1]."""
    tokens = torch.tensor([ids[:-1]])
    logits = model.model.forward(tokens, positions_after(0, tokens.shape[1], 1, "cpu"),
                                 model.model.new_cache(1, len(ids))).logits[0, first - 1:, :vocab]
    return processed_probs(logits.float(), params)


def interval_overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(N,) the measure of u in [0, 1) that both inverse CDFs send to the same token."""
    p_hi, q_hi = p.cumsum(-1), q.cumsum(-1)
    low = torch.maximum(p_hi - p, q_hi - q)
    return (torch.minimum(p_hi, q_hi) - low).clamp_min(0).sum(-1)


def gumbel_agreement(p: torch.Tensor, q: torch.Tensor, floor: float = 1e-5) -> torch.Tensor:
    """(N,) P(argmax(log p + g) == argmax(log q + g)), summed over the tokens x both give more than `floor`
    (the rest add at most their own small mass): a slight underestimate."""
    out = []
    for p_row, q_row in zip(p.double(), q.double()):
        both = ((p_row > floor) & (q_row > floor)).nonzero().squeeze(-1)  # (m,)
        ratios = torch.maximum(p_row[None, :] / p_row[both, None], q_row[None, :] / q_row[both, None])  # (m, V)
        out.append(float((1.0 / ratios.sum(-1)).sum()))
    return torch.tensor(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--draft-weights", default="int4")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--tasks", default="code,mt_bench,qa")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    target = load_model(args.target, weights=args.weights)
    draft = load_model(args.draft, weights=args.draft_weights)
    vocab = target.model.vocab_size
    params = SamplingParams(temperature=args.temperature)
    generator = SpeculativeGenerator(target, None)
    figures: dict[str, list[float]] = {"rejection": [], "match": [], "gumbel": []}
    for index, prompt in enumerate(load_prompts(args.tasks.split(","), args.limit)):
        ids = generator.encode(prompt.prompt, prompt.chat)
        text = generator.generate(prompt.prompt, args.max_new_tokens, chat=prompt.chat,
                                  temperature=args.temperature, seed=index).token_ids
        full = ids + text
        with torch.no_grad():
            p = position_probs(target, full, len(ids), params, vocab)
            q = position_probs(draft, full, len(ids), params, vocab)
        figures["rejection"] += (1 - 0.5 * (p - q).abs().sum(-1)).tolist()
        figures["match"] += interval_overlap(p, q).tolist()
        figures["gumbel"] += gumbel_agreement(p, q).tolist()
        print(f"{prompt.task}/{prompt.prompt_id}: {len(text)} positions, "
              + ", ".join(f"{rule} {statistics.mean(values[-len(text):]):.3f}" for rule, values in figures.items()))
    print(f"mean over {len(figures['match'])} positions at T={args.temperature}: "
          + ", ".join(f"{rule} {statistics.mean(values):.3f}" for rule, values in figures.items()))


if __name__ == "__main__":
    main()
