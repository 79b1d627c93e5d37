"""`specdec bench` (drafters against plain decoding and the peers, on prompt sets) and `specdec bench serve`
(concurrent clients against our server and llama-server)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdec.cli_options import (add_k_option, add_model_options, add_sampling_options, add_target_option,
                                 sampling_from_args)


def add_parser(commands) -> None:
    """`specdec bench`: drafters against plain decoding and the peers."""
    bench = commands.add_parser("bench", help="benchmark drafters against plain decoding and transformers")
    add_model_options(bench)  # the transformers peers run the same dtype, always with float32 weights
    add_k_option(bench)
    bench.add_argument("--drafters", default="auto", help="comma-separated drafter specs ('auto': what "
                       "generate would run for this target)")
    bench.add_argument("--tasks", default="code,mt_bench", help="comma-separated: mt_bench, translation, "
                       "summarization, qa, math_reasoning, rag, an MT-bench category alone (writing, roleplay, "
                       "reasoning, math, coding, extraction, stem, humanities), code, edit (code edits: ask 256+ "
                       "tokens), longdoc (2-3k-token files quoted), longedit (a function edited inside a ~4k-token file)")
    bench.add_argument("--limit", type=int, default=5, help="prompts per task")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    add_sampling_options(bench, seed_default=0)
    bench.add_argument("--acceptance", default="match",
                       help="comma-separated sampling rules to run each drafter under (match, rejection)")
    bench.add_argument("--peers", default="", help="comma-separated peers: transformers' plain, lookup, assisted:MODEL; "
                       "llama.cpp's llamacpp, llamacpp-draft:MODEL[@N], llamacpp-spec:TYPES[@N][:MODEL] and "
                       "llamacpp-best (each mode; the report's best row) (programs from $SPECDEC_LLAMA_CPP or PATH)")
    bench.add_argument("--spec-bench", default=None, help="path to Spec-Bench question.jsonl")
    bench.add_argument("--json", dest="json_out", default=None, help="write all results to this JSON file")
    bench.add_argument("--out", default=None, help="directory for report.md, results.json and PNG charts")
    bench.add_argument("--roofline-mb", type=int, default=1024,
                       help="buffer for the bandwidth measurement in MB (0 skips the roofline)")


def add_serve_parser(commands) -> None:
    """`specdec bench serve`: concurrent clients against our server and llama-server."""
    bench_serve = commands.add_parser(
        "bench-serve", help="`specdec bench serve`: concurrent streaming clients against our server and "
        "llama.cpp's on the same model: throughput, TTFT, time per token")
    add_target_option(bench_serve)
    bench_serve.add_argument("--server-args", default="", help="more `specdec serve` options, e.g. "
                             "'--max-active 64 --drafter ngram'")
    bench_serve.add_argument("--url", default=None, help="measure this running server (…/v1) instead of starting ours")
    bench_serve.add_argument("--ours", action=argparse.BooleanOptionalAction, default=True,
                             help="start and measure our server (--no-ours: the peers only)")
    bench_serve.add_argument("--clients", default="1,64", help="comma-separated concurrent client counts")
    bench_serve.add_argument("--max-tokens", type=int, default=128)
    bench_serve.add_argument("--system-prompt", default=None, help="a system message every client sends first")
    bench_serve.add_argument("--tasks", default="code,mt_bench,qa,summarization",
                             help="prompt sets the clients cycle through (all but code need Spec-Bench's "
                                  "question.jsonl: --tasks code works without it)")
    bench_serve.add_argument("--peers", default="", help="llamacpp: llama.cpp's llama-server on the target's GGUF "
                             "file (from $SPECDEC_LLAMA_CPP or PATH)")
    bench_serve.add_argument("--threads", dest="server_threads", type=int, default=os.cpu_count() or 1, help="llama-server's threads")
    bench_serve.add_argument("--slot-context", type=int, default=2048, help="llama-server's context per slot")
    bench_serve.add_argument("--json", dest="json_out", default=None, help="write the reports to this JSON file")


def config_from_args(args):
    """The run's BenchConfig, every drafter spec and option checked before the target loads."""
    from specdec.api.options import GeneratorOptions
    from specdec.bench.runner import BenchConfig
    from specdec.core.verify import Acceptance
    from specdec.drafters.registry import split_drafter_specs

    split = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    rules = [Acceptance.parse(rule) for rule in split(args.acceptance) or [args.acceptance]]
    for spec in split_drafter_specs(args.drafters):
        GeneratorOptions(args.target, spec, args.k, args.device, args.dtype, args.backend, args.weights,
                         kv_dtype=args.kv_dtype)
    return BenchConfig(args.target, split_drafter_specs(args.drafters), split(args.tasks), args.limit,
                       args.max_new_tokens, sampling_from_args(args), args.seed, args.k, split(args.peers),
                       args.device, args.roofline_mb, args.weights, args.dtype, args.cuda_graphs, args.backend, rules,
                       args.kv_dtype)


def run(config, spec_bench: str | None, json_out: str | None, out: str | None) -> int:
    from specdec.bench.report import markdown, write_atomically, write_report_dir
    from specdec.bench.runner import run_bench
    from specdec.bench.tasks import load_prompts

    prompts = load_prompts(config.tasks, config.limit, Path(spec_bench) if spec_bench else None)
    results = run_bench(config, prompts)
    print(markdown(results))
    if json_out:
        write_atomically(Path(json_out), json.dumps(results.to_dict(), indent=1))
    if out:
        for path in write_report_dir(results, Path(out)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def run_serve(args) -> int:
    from specdec.bench.serve_bench import run_serve_bench

    return run_serve_bench(args)
