"""Round by round, which source of a combined drafter (`ngram+draft:...`, the 1.5B's default) drafted, and what
each kind of round yields: rounds, draft tokens, acceptance, tokens committed per round, milliseconds per
round (drafting, of it a draft model's catch-up on tokens other sources committed, and the whole round:
draft + verify + commit), the K asked.

    python scripts/lab/combined_rounds.py [--target qwen2.5-coder-1.5b-instruct] [--drafter SPEC] [--tasks mt_bench]
        [--limit 4] [--max-new-tokens 192]

Kinds: "lookup-verbatim" (a long match, always taken), "lookup" (a weaker guess), "model", "none" (every
source passed over: a plain step). Greedy; the tokens/s of each generation are printed first.
"""

from __future__ import annotations

import argparse
import collections
import time

from specdec.api.generator import SpeculativeGenerator
from specdec.bench.tasks import load_prompts
from specdec.drafters.combined import CombinedDrafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="default")
    parser.add_argument("--tasks", default="mt_bench")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    args = parser.parse_args()

    # kind, K asked, drafted, accepted, draft s, catch-up s, round s
    rounds: list[tuple[str, int, int, int, float, float, float]] = []
    propose, on_verified = CombinedDrafter.propose, CombinedDrafter.on_verified

    def recording_propose(self, context, max_tokens, params, noise):
        draft = propose(self, context, max_tokens, params, noise)
        kind = "none" if self.proposer is None else "model" if self.proposer == len(self.sources) - 1 else \
            "lookup-verbatim" if self.verbatim else "lookup"
        asked = max_tokens if draft.asked is None else draft.asked  # a source's own K (SourceLengths)
        self.recorded = (kind, asked, len(draft), time.perf_counter() - self.started, self.catch_up_seconds)
        return draft

    def recording_on_verified(self, context, draft, result):
        kind, k, drafted, draft_seconds, catch_up = self.recorded
        rounds.append((kind, k, drafted, result.num_accepted, draft_seconds, catch_up,
                       time.perf_counter() - self.started))
        on_verified(self, context, draft, result)

    CombinedDrafter.propose, CombinedDrafter.on_verified = recording_propose, recording_on_verified
    generator = SpeculativeGenerator.from_pretrained(args.target, drafter=args.drafter)
    prompts = [p.prompt for p in load_prompts(args.tasks.split(","), args.limit)]
    generator.generate(prompts[0], 8)  # warm
    rounds.clear()
    for prompt in prompts:
        stats = generator.generate(prompt, args.max_new_tokens).stats
        print(f"{stats.tokens_per_second:.1f} tok/s, tau {stats.tau:.2f}")
    print("| round | rounds | draft tokens | accepted | tokens a round | draft ms a round | of it catch-up ms | round ms "
          "| tokens/s | K asked |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    kinds: dict[str, list] = collections.defaultdict(list)
    for kind, *rest in rounds:
        kinds[kind].append(rest)
    for kind, entries in sorted(kinds.items()):
        count = len(entries)
        drafted, accepted = sum(e[1] for e in entries), sum(e[2] for e in entries)
        draft_ms, catch_up_ms, round_ms = (1e3 * sum(e[i] for e in entries) / count for i in (3, 4, 5))
        tokens = (accepted + count) / count
        asked = dict(sorted(collections.Counter(e[0] for e in entries).items()))
        print(f"| {kind} | {count} | {drafted} | {accepted} ({accepted / max(drafted, 1):.0%}) | {tokens:.2f} | "
              f"{draft_ms:.1f} | {catch_up_ms:.1f} | {round_ms:.1f} | {1e3 * tokens / round_ms:.1f} | {asked} |")


if __name__ == "__main__":
    main()
