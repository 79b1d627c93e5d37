"""Interleaved A/B of a windowed draft model's catch-up (`draft:MODEL@context=N`): a draft that would feed
more than N committed tokens before drafting (first asked late, or back after lookup drafted a long run)
restarts from the context's last N tokens, against the old catch-up on everything since the prompt's window
("|old"), and plain decoding, on the same prompts in turn. Each generator keeps its measurements across
prompts, as a script or a server does; tokens a second count the prompt's prefill; greedy outputs are checked
against plain.

    python scripts/lab/draft_window_ab.py   # code and edit tasks, 4 prompts each, 256 tokens: "default|old;default"

Methods are separated by ";": a drafter spec (`default`: the target's default), then "|old" for the old
catch-up and "|k=N" for a fixed K (default auto).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from specdec.api.generator import SpeculativeGenerator, auto_drafter
from specdec.drafters import make_drafter
from specdec.bench.tasks import load_prompts


def old_catch_up(generator: SpeculativeGenerator) -> SpeculativeGenerator:
    """The generator's draft model catching up on everything after the prompt's window, however long."""
    for source in getattr(generator.drafter, "sources", [generator.drafter]):
        if hasattr(source, "prompt_window"):
            source._unseen = lambda context, source=source: list(context[source.skipped + source.cache.length:])
    return generator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--tasks", default="code,edit")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--methods", default="default|old;default")
    args = parser.parse_args()
    plain = SpeculativeGenerator.from_pretrained(args.target, drafter="none")
    methods = {"plain": plain}
    for method in args.methods.split(";"):
        spec, *flags = method.split("|")
        spec = auto_drafter(plain.target, "cpu", "float32") if spec == "default" else spec
        k = next((flag[2:] for flag in flags if flag.startswith("k=")), "auto")
        generator = SpeculativeGenerator(plain.target, make_drafter(spec, plain.target, "cpu", "float32"), k)
        methods[method] = old_catch_up(generator) if "old" in flags else generator
    for generator in methods.values():
        generator.generate("Hello", 8)  # warm-up: kernels built, the drafter's costs first measured
    seconds, tokens = defaultdict(float), defaultdict(int)  # (task, method) ->
    ratios, mismatches = defaultdict(list), 0
    for prompt in load_prompts(args.tasks.split(","), args.limit):
        rates = {}
        for name, generator in methods.items():
            result = generator.generate(prompt.prompt, args.max_new_tokens, chat=prompt.chat)
            seconds[prompt.task, name] += result.stats.seconds
            tokens[prompt.task, name] += result.stats.new_tokens
            rates[name] = result.stats.new_tokens / result.stats.seconds
            if name == "plain":
                plain_ids = result.token_ids
            elif result.token_ids != plain_ids:
                mismatches += 1
        for name in methods:
            ratios[prompt.task, name].append(rates[name] / rates["plain"])
        print(f"{prompt.task} {prompt.prompt_id}: {len(plain_ids)} tokens, " + ", ".join(
            f"{name} {rates[name]:.1f} tok/s ({rates[name] / rates['plain']:.2f}x)" for name in methods), flush=True)
    tasks = list(dict.fromkeys(task for task, _ in seconds))
    print("\n| method | " + " | ".join(tasks) + " | overall |\n|---|" + "---|" * (len(tasks) + 1))
    for name in methods:
        cells = []
        for group in [[task] for task in tasks] + [tasks]:
            rate = sum(tokens[t, name] for t in group) / sum(seconds[t, name] for t in group)
            plain_rate = sum(tokens[t, "plain"] for t in group) / sum(seconds[t, "plain"] for t in group)
            median = statistics.median(r for t in group for r in ratios[t, name])
            cells.append(f"{rate:.2f} ({rate / plain_rate:.2f}x, median {median:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\noutputs different from plain: {mismatches}")


if __name__ == "__main__":
    main()
