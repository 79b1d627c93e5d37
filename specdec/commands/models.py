"""`specdec pull` (zoo models fetched, checked and converted) and `specdec models` (the zoo, or with --local
every model found on this machine and which can draft for which)."""

from __future__ import annotations

import sys

from specdec.cli_options import MODELS_DIR_HELP


def add_parsers(commands) -> None:
    pull = commands.add_parser("pull", help="download, verify and convert zoo models")
    pull.add_argument("names", nargs="+", metavar="name")
    models = commands.add_parser("models", help="list zoo models, pulled or not (--local: every model found on "
                                                "this machine, and which can draft for which)")
    models.add_argument("--local", action="store_true",
                        help="list the models in Ollama's store, the Hugging Face cache, LM Studio's folder, "
                             "--models-dir and the pulled zoo: architecture, parameters, quantization, size, "
                             "tokenizer fingerprint, drafts")
    models.add_argument("--models-dir", default=None, help=MODELS_DIR_HELP)


def run_pull(names: list[str]) -> int:
    from specdec.models.sources import zoo

    for name in names:
        print(zoo.pull(name))
    return 0


def run_models(local: bool) -> int:
    from specdec.models.sources import zoo
    from specdec.paths import models_dir

    if local:
        return list_local_models()
    print(f"{'name':30} {'architecture':13} {'runs':12} {'pulled':7} {'size':>7}  path")
    for row in zoo.list_models():
        size = f"{row.size_bytes / 1e6:.0f} MB" if row.size_bytes else "?"
        runs = "native" if row.native else "transformers"
        print(f"{row.name:30} {row.architecture:13} {runs:12} {'yes' if row.pulled else 'no':7} {size:>7}  "
              f"{row.path if row.pulled else '-'}")
    print(f"(cache: {models_dir()}; set SPECDEC_HOME to move it)", file=sys.stderr)
    return 0


def list_local_models() -> int:
    """`specdec models --local`: one line a model, then which others can draft for it."""
    from tqdm import tqdm

    from specdec.models.sources.local_models import describe, draft_candidates, found_models

    models = [describe(found) for found in tqdm(found_models(), desc="reading headers", unit="model",
                                                  disable=not sys.stderr.isatty(), leave=False)]
    print(f"{'name':44} {'store':10} {'arch':9} {'params':7} {'quant':9} {'size':>8}  {'tokenizer':16}  drafts")
    for model in models:
        if model.problem:
            print(f"{model.name:44} {model.store:10} unreadable: {model.problem}")
            continue
        drafts = ", ".join(draft.name for draft in draft_candidates(model, models)) or "-"
        print(f"{model.name:44} {model.store:10} {model.architecture:9} {model.parameters:7} {model.quantization:9} "
              f"{model.size_bytes / 1e6:>6.0f} MB  {model.fingerprint:16}  {drafts}")
    if not models:
        print("(no models found: see `specdec models --help` for where they are looked for)", file=sys.stderr)
    return 0
