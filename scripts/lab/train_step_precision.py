"""What one training step of a head costs in float32 and in bfloat16 (training/precision.py), interleaved in
one process (medians, seconds): the target's real embeddings and LM-head rows, random features of the
target's width (a step's arithmetic does not depend on their values), the CLI's default batch.

    python scripts/lab/train_step_precision.py                 # EAGLE-3 for Qwen2.5-Coder-1.5B (its GGUF blocks)
    python scripts/lab/train_step_precision.py --kind eagle --model smollm2-135m-instruct --weights float32
"""

import argparse
import platform
import statistics
import time

import torch

from specdec.models.sources.loading import load_model
from specdec.training.features import TOP_K, FeatureSet
from specdec.training.precision import native_bf16, training_arithmetic
from specdec.training.train import Objective, TrainConfig, feature_layers, new_head


def random_batch(model, config: TrainConfig, window: int, generator: torch.Generator) -> FeatureSet:
    width = model.hidden_size * len(feature_layers(config, model))
    shape = (config.batch_windows, window)
    tokens = torch.randint(0, model.vocab_size, shape, generator=generator)
    top_ids = torch.randint(0, model.vocab_size, (*shape, TOP_K), generator=generator)
    top_ids[..., 0] = torch.randint(0, config.draft_vocab_size, shape, generator=generator)  # inside the vocab
    probs = torch.rand(*shape, TOP_K, generator=generator)
    features = torch.randn(*shape, width, generator=generator).to(torch.float16)
    return FeatureSet(tokens, features, top_ids, probs / probs.sum(-1, keepdim=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--weights", default="gguf")
    parser.add_argument("--kind", default="eagle3", choices=["eagle", "eagle3", "medusa"])
    parser.add_argument("--intermediate-size", type=int, default=0)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model, backend="native", weights=args.weights).model
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for rep in range(args.reps + 1):  # the first round warms up (oneDNN's kernels, allocations)
        for precision in times:
            config = TrainConfig(args.kind, intermediate_size=args.intermediate_size, precision=precision)
            torch.manual_seed(0)
            module = new_head(config, model)
            objective = Objective(config, model, torch.arange(config.draft_vocab_size))
            batch = random_batch(model, config, args.window, generator)
            began = time.perf_counter()
            with training_arithmetic(precision, "cpu"):
                loss, _ = objective(module, batch, generator)
            loss.backward()
            if rep:
                times[precision].append(time.perf_counter() - began)
    print(f"{args.model} ({args.weights}), {args.kind} head, {torch.get_num_threads()} threads, "
          f"{platform.machine()}, native bf16: {native_bf16('cpu') or 'none'}")
    print(f"one step (forward + backward, {TrainConfig.batch_windows} windows of {args.window} tokens), medians:")
    for precision, seconds in times.items():
        print(f"  {precision}: {statistics.median(seconds):.2f} s")
    print(f"  bfloat16 / float32 speed: {statistics.median(times['float32']) / statistics.median(times['bfloat16']):.2f}x")


if __name__ == "__main__":
    main()
