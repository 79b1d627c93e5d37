"""Choose a layer-skip self-draft: measure candidate layer subsets on a few calibration prompts.

    python -m specdec.bench.layer_skip_search smollm2-135m-instruct --prompts 4 --max-new-tokens 64

For each candidate subset, greedy speculative decoding with a fixed K runs on the calibration prompts
(the first prompts of the code, mt_bench and qa tasks), interleaved with plain decoding; the table gives
acceptance, tau and decode speed relative to plain decoding. The best subset goes into
specdec.drafters.self_draft.DEFAULT_LAYER_SUBSETS.
"""

from __future__ import annotations

import argparse

from specdec.bench.tasks import load_prompts
from specdec.drafters.self_draft import layer_skip_draft
from specdec.api.generator import SpeculativeGenerator
from specdec.models.sources.loading import load_model


def candidate_subsets(num_layers: int) -> list[str]:
    quarter, half = num_layers // 4, num_layers // 2
    return [
        f"first:{half}", f"first:{3 * quarter}", "every:2", "every:3",
        f"0-{quarter - 1},{num_layers - quarter}-{num_layers - 1}",  # skip the middle half
        f"0-{half - 1},{num_layers - 2}-{num_layers - 1}",  # first half and the last two
        f"0-{3 * quarter - 1},{num_layers - 1}",  # first three quarters and the last
    ]


def decode_rate(generator: SpeculativeGenerator, prompts, max_new_tokens: int):
    tokens = seconds = accepted = drafted = rounds = 0
    for prompt in prompts:
        stats = generator.generate(prompt.prompt, max_new_tokens, chat=prompt.chat).stats
        tokens += stats.new_tokens
        seconds += stats.seconds - stats.prefill_seconds
        accepted, drafted, rounds = accepted + stats.accepted, drafted + stats.drafted, rounds + stats.rounds
    return tokens / seconds, accepted / max(drafted, 1), (accepted + rounds) / max(rounds, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--prompts", type=int, default=4, help="calibration prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args(argv)
    target = load_model(args.target)
    prompts = load_prompts(["code", "mt_bench", "qa"], args.prompts)[: args.prompts]
    plain = SpeculativeGenerator(target, None)
    plain.generate("Hello", 4)  # warm-up
    print(f"target {target.name}, {target.model.num_layers} layers, K={args.k}, {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens each\n")
    print("| layers kept | count | acceptance | tau | decode tokens/s | vs plain (same loop) |")
    print("|---|---|---|---|---|---|")
    best = None
    for spec in candidate_subsets(target.model.num_layers):
        drafter = layer_skip_draft(target, spec)
        base_rate, _, _ = decode_rate(plain, prompts, args.max_new_tokens)
        rate, acceptance, tau = decode_rate(SpeculativeGenerator(target, drafter, args.k), prompts,
                                            args.max_new_tokens)
        kept = drafter.model.num_layers
        print(f"| {spec} | {kept} | {acceptance:.2f} | {tau:.2f} | {rate:.1f} | {rate / base_rate:.2f}x |",
              flush=True)
        if best is None or rate / base_rate > best[1]:
            best = (spec, rate / base_rate)
    print(f"\nbest: layerskip:{best[0]} ({best[1]:.2f}x)")


if __name__ == "__main__":
    main()
