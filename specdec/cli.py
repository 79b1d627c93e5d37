"""The `specdec` command: the parser built from the verbs (specdec/commands/, one module each), and the
dispatch: each verb's arguments become its typed options (checked before anything loads), then it runs.

Errors a user can cause print one line (`specdec: error: ...`) and exit 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from specdec.certify import command as certify
from specdec.cli_options import OneLineParser, use_threads
from specdec.commands import analyze, bench, datastore, export, generate, models, pair, serve, train
from specdec.errors import SpecdecError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="specdec", description="Exact speculative decoding for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands)
    certify.add_certify_parser(commands)
    pair.add_parser(commands)
    models.add_parsers(commands)
    for verb in (serve, bench, analyze, datastore, export, train):
        verb.add_parser(commands)
    bench.add_serve_parser(commands)
    return parser


# verb -> what runs it, from the parsed arguments (each builds its typed options first)
VERBS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": lambda args: generate.run(generate.GenerateOptions.from_args(args)),
    "serve": lambda args: serve.run(serve.ServeOptions.from_args(args)),
    "pair": lambda args: pair.run(pair.PairOptions.from_args(args)),
    "pull": lambda args: models.run_pull(args.names),
    "models": lambda args: models.run_models(args.local),
    "bench": lambda args: bench.run(bench.config_from_args(args), args.spec_bench, args.json_out, args.out),
    "bench-serve": lambda args: bench.run_serve(args),
    "analyze": lambda args: analyze.run(analyze.AnalyzeOptions.from_args(args)),
    "train": lambda args: train.run(train.TrainOptions.from_args(args)),
    "export": export.run,
    "datastore": datastore.run,
    "certify": certify.run_certify,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "serve"]:  # `bench` itself takes options only: `bench serve` is its own command
        argv = ["bench-serve", *argv[2:]]
    args = build_parser().parse_args(argv)
    use_threads(getattr(args, "threads", None))
    if getattr(args, "models_dir", None):  # where stores.py looks for a name, for this command
        os.environ["SPECDEC_MODELS_DIR"] = args.models_dir
    try:
        return VERBS[args.command](args)
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
