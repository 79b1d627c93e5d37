"""`specdec train`: an EAGLE, EAGLE-3 or Medusa head trained for a target on this machine, or a draft model's
LoRA adapter distilled toward it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.cli_options import add_target_option
from specdec.errors import InvalidParameterError

if TYPE_CHECKING:  # the training modules load when a command runs (commands/__init__.py)
    from specdec.training.corpus import CorpusConfig
    from specdec.training.distill import DistillConfig
    from specdec.training.train import TrainConfig


def add_parser(commands) -> None:
    """`specdec train`: a head, or a draft model's LoRA adapter, trained on this machine."""
    from specdec.training.precision import PRECISIONS

    train = commands.add_parser("train", help="train an EAGLE, EAGLE-3 or Medusa head for a target, or distill a "
                                "draft model toward it (a LoRA adapter), on this machine")
    train.add_argument("kind", choices=["eagle", "eagle3", "medusa", "distill"])
    add_target_option(train)
    train.add_argument("--out", required=True, help="directory for head.safetensors and head.json (distill: the "
                       "adapter's files and distill.json)")
    train.add_argument("--steps", type=int, default=600)
    train.add_argument("--batch-windows", type=int, default=8, help="token windows per step")
    train.add_argument("--learning-rate", type=float, default=None, help="default: 1e-3 for heads, 2e-4 for distill")
    train.add_argument("--draft", help="distill: the draft model to distill toward the target (zoo name or directory)")
    train.add_argument("--lora-rank", type=int, default=16, help="distill: the adapter's rank")
    train.add_argument("--head-vocab", type=int, default=0, help="distill: the draft drafts with vocab=N: score ids "
                       "< N only (0: all)")
    train.add_argument("--draft-weights", default="int4:128", help="distill: the draft's weight format when the "
                       "adapter is measured drafting (as --drafter draft:MODEL@weights=FORMAT)")
    train.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head scores (most predicted first)")
    train.add_argument("--medusa-heads", type=int, default=4)
    train.add_argument("--intermediate-size", type=int, default=0, help="EAGLE layer MLP width (0: the target's)")
    train.add_argument("--feature-layers", default="", help="EAGLE-3: target layer ids to fuse, e.g. 2,15,27 "
                       "(speculators' ids: L is decoder layer L's input; default: low, middle and high)")
    train.add_argument("--code-tokens", type=int, default=160_000, help="corpus tokens of Python source")
    train.add_argument("--prose-tokens", type=int, default=80_000, help="corpus tokens of package documentation")
    train.add_argument("--generated", type=int, default=1024, help="answers the target writes itself for the corpus")
    train.add_argument("--answer-tokens", type=int, default=200, help="tokens per self-generated answer")
    train.add_argument("--window", type=int, default=256, help="tokens per training window")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu", help="cpu or cuda")
    train.add_argument("--weights", default="float32",
                       help="the target's weight format for computing the features and self-generated answers "
                       "(float32 by default; gguf: a GGUF model's own blocks, several times faster on a CPU); "
                       "the head drafts for the model whatever its format")
    train.add_argument("--precision", default="auto", choices=PRECISIONS,
                       help="the training steps' matrix products (weights, optimizer and losses stay float32); "
                       "auto: bfloat16 where the hardware multiplies bf16 natively (AMX-BF16, AVX512-BF16, CUDA), "
                       "float32 elsewhere")


@dataclass(frozen=True)
class TrainOptions:
    """What `specdec train` was asked, checked at construction (before the target loads): the corpus, the
    head's or the adapter's training configuration, where it goes."""

    kind: str  # eagle, eagle3, medusa or distill
    target: str
    out: Path
    device: str
    weights: str
    corpus: "CorpusConfig"
    config: "TrainConfig | DistillConfig"  # a head's, or distill's
    precision_reason: str
    draft: str | None = None  # distill: the draft model
    draft_weights: str = "int4:128"

    @classmethod
    def from_args(cls, args) -> "TrainOptions":
        from specdec.training.corpus import CorpusConfig
        from specdec.training.precision import resolve_precision

        check_numbers(args)
        out = Path(args.out)
        written = "distill.json" if args.kind == "distill" else "head.json"
        if out.exists() and not (out / written).exists() and any(out.iterdir()):
            raise InvalidParameterError(f"{out}: exists and is not a{' distilled adapter' if args.kind == 'distill' else ' head'} "
                                        "directory; choose a new --out")
        corpus = CorpusConfig(args.code_tokens, args.prose_tokens, args.generated, args.answer_tokens,
                              window=args.window, seed=args.seed)
        precision, why = resolve_precision(args.precision, args.device)
        config = distill_config(args, precision) if args.kind == "distill" else head_config(args, precision)
        return cls(args.kind, args.target, out, args.device, args.weights, corpus, config, why, args.draft,
                   args.draft_weights)


def check_numbers(args) -> None:
    numbers = {"--steps": args.steps, "--batch-windows": args.batch_windows, "--draft-vocab": args.draft_vocab,
               "--lora-rank": args.lora_rank,
               "--medusa-heads": args.medusa_heads, "--window": args.window, "--answer-tokens": args.answer_tokens}
    for flag, value in numbers.items():
        if value < 1 or (flag == "--window" and value < 8):
            raise InvalidParameterError(f"{flag} must be at least {8 if flag == '--window' else 1}")
    if min(args.code_tokens, args.prose_tokens, args.generated, args.intermediate_size, args.head_vocab) < 0 or (
            args.learning_rate is not None and args.learning_rate <= 0):
        raise InvalidParameterError("corpus sizes, --intermediate-size and --head-vocab must be >= 0, --learning-rate > 0")
    if (args.kind == "distill") != (args.draft is not None):
        raise InvalidParameterError("--draft names the draft model distill trains, and only distill takes it")


def head_config(args, precision: str):
    from specdec.training.train import TrainConfig

    try:
        layers = tuple(int(item) for item in args.feature_layers.split(",") if item.strip())
    except ValueError:
        raise InvalidParameterError(f"--feature-layers {args.feature_layers!r}: expected ids like 2,15,27") from None
    if layers and args.kind != "eagle3":
        raise InvalidParameterError("--feature-layers applies to eagle3 heads only")
    return TrainConfig(args.kind, steps=args.steps, batch_windows=args.batch_windows,
                       learning_rate=args.learning_rate or 1e-3, draft_vocab_size=args.draft_vocab,
                       medusa_heads=args.medusa_heads, intermediate_size=args.intermediate_size,
                       feature_layers=layers, seed=args.seed, precision=precision)


def distill_config(args, precision: str):
    from specdec.training.distill import DistillConfig

    return DistillConfig(steps=args.steps, batch_windows=args.batch_windows, learning_rate=args.learning_rate or 2e-4,
                         rank=args.lora_rank, head_vocab=args.head_vocab or None, precision=precision, seed=args.seed,
                         device=args.device)


def run(options: TrainOptions) -> int:
    from specdec.models.sources.loading import load_model
    from specdec.training.command import run_training

    if options.kind == "distill":
        return run_distill(options)
    print(f"specdec: training steps in {options.config.precision} ({options.precision_reason})", file=sys.stderr)
    target = load_model(options.target, device=options.device, backend="native", weights=options.weights)
    info = run_training(options.kind, target, options.out, options.corpus, options.config)
    validation = info.validation
    print(f"specdec: wrote {options.out} ({options.kind} head for {target.name}); validation: "
          + ", ".join(f"{k} {v}" for k, v in validation.items() if isinstance(v, float))
          + f"; end to end: tau {validation['end_to_end']['tau']}, greedy exact "
          f"{validation['end_to_end']['greedy_matches_plain']}")
    return 0


def run_distill(options: TrainOptions) -> int:
    """`specdec train distill`: the draft's LoRA adapter toward the target (training/distill.py)."""
    from specdec.models.sources.loading import load_model
    from specdec.training.distill import run_distillation

    print(f"specdec: distilling in {options.config.precision} ({options.precision_reason})", file=sys.stderr)
    target = load_model(options.target, device=options.device, backend="native", weights=options.weights)
    figures = run_distillation(target, options.draft, options.out, options.corpus, options.config,
                               options.draft_weights)
    before, after = figures["validation"]["before"], figures["validation"]["after"]
    tau = figures["end_to_end"]
    print(f"specdec: wrote {options.out} (a LoRA adapter of {figures['draft']} for {target.name}); held-out agreement "
          f"{before['top1_agreement']} -> {after['top1_agreement']}, loss {before['loss']} -> {after['loss']}; "
          f"tau {tau['without']['tau']} -> {tau['with']['tau']}, greedy exact {tau['with']['greedy_matches_plain']}; "
          f"draft with --drafter draft:{options.draft}@adapter={options.out}")
    return 0
