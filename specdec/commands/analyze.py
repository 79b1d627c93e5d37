"""`specdec analyze`: the theory as a calculator (expected tokens per round, speedup, best K), or fitted to a
`specdec bench --json` run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InvalidParameterError, SpecdecError


def add_parser(commands) -> None:
    """`specdec analyze`: the theory as a calculator, or fitted to a bench run."""
    analyze = commands.add_parser("analyze", help="the theory as a calculator: expected tokens per round, "
                                  "speedup, best K; or fit it to a bench run")
    analyze.add_argument("--k", type=int, default=5, help="draft tokens per round")
    analyze.add_argument("--alpha", default="0.8", help="acceptance rate, or per-position rates a1,a2,...")
    analyze.add_argument("--c", type=float, default=0.0, help="draft cost per token / one target decode step")
    analyze.add_argument("--verify-slope", type=float, default=0.0,
                         help="verify cost v(K) = 1 + slope*K, in target decode steps")
    analyze.add_argument("--max-k", type=int, default=16)
    analyze.add_argument("--from-bench", default=None, help="fit alpha, c and v(K) to `specdec bench --json` output")
    analyze.add_argument("--plot", default=None, help="write a PNG chart here")


@dataclass(frozen=True)
class AnalyzeOptions:
    """The calculator's inputs, read and checked at construction; or a bench run to fit."""

    k: int
    alphas: tuple[float, ...]
    draft_cost: float
    verify_slope: float
    max_k: int
    from_bench: Path | None = None
    plot: Path | None = None

    @classmethod
    def from_args(cls, args) -> "AnalyzeOptions":
        try:
            alphas = tuple(float(part) for part in args.alpha.split(","))
        except ValueError:
            raise InvalidParameterError(f"--alpha must be a number or a comma-separated list, not {args.alpha!r}") from None
        return cls(args.k, alphas, args.c, args.verify_slope, args.max_k,
                   Path(args.from_bench) if args.from_bench else None, Path(args.plot) if args.plot else None)


def run(options: AnalyzeOptions) -> int:
    from specdec.core import analysis

    if options.from_bench:
        return run_fit(options.from_bench, options.plot)
    verify = analysis.VerifyCost(slope=options.verify_slope)
    print(analysis.theory_table(list(options.alphas), options.k, options.draft_cost, verify, options.max_k))
    if options.plot:
        from specdec.bench.plots import plot_speedup_vs_k

        plot_speedup_vs_k(list(options.alphas), options.draft_cost, verify, options.max_k, options.plot)
    return 0


def run_fit(bench_json: Path, plot: Path | None) -> int:
    """The theory fitted to a bench run: alpha per position, c and v(K) per drafter, measured and predicted."""
    from specdec.core import analysis

    try:
        results = json.loads(bench_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecdecError(f"cannot read bench results {bench_json}: {exc}") from None
    fitted = analysis.fit_from_bench(results)
    print(analysis.fitted_table(fitted))
    if plot and fitted:
        from specdec.bench.plots import plot_tokens_per_round

        measured = [(f.method, (f.measured_tokens_per_round - 1) / f.mean_k, f.measured_tokens_per_round,
                     max(1, round(f.mean_k))) for f in fitted]
        plot_tokens_per_round(measured, plot)
    return 0
