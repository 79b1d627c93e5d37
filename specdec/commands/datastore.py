"""`specdec datastore build`: a retrieval datastore (a corpus tokenized and indexed) for --drafter
retrieval:DIR."""

from __future__ import annotations

from pathlib import Path

from specdec.cli_options import add_target_option


def add_parser(commands) -> None:
    """`specdec datastore build`: a retrieval datastore."""
    datastore = commands.add_parser("datastore", help="retrieval datastores for --drafter retrieval:DIR")
    datastore_commands = datastore.add_subparsers(dest="datastore_command", required=True)
    build = datastore_commands.add_parser("build", help="tokenize a corpus and index it (suffix array)")
    build.add_argument("corpus", nargs="+", help="text files or directories (walked for code and text files)")
    add_target_option(build, help_text="the model whose tokenizer the datastore uses")
    build.add_argument("--out", required=True, help="datastore directory to write")


def run(args) -> int:
    from specdec.heads.datastore import build_datastore
    from specdec.models.sources.checkpoint import read_config
    from specdec.models.sources.loading import resolve_model_dir
    from specdec.models.sources.tokenizer_files import load_tokenizer

    name, model_dir = resolve_model_dir(args.target)
    tokenizer = load_tokenizer(model_dir)
    vocab_size = int(read_config(model_dir).get("vocab_size", len(tokenizer)))
    info = build_datastore([Path(p) for p in args.corpus], tokenizer, vocab_size, Path(args.out), name)
    print(f"specdec: wrote {args.out}: {info['tokens']:,} tokens from {info['files']} files")
    return 0
