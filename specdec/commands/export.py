"""`specdec export`: a trained head written in another tool's format (speculators, for vLLM)."""

from __future__ import annotations

from pathlib import Path

from specdec.cli_options import add_target_option
from specdec.errors import InvalidParameterError


def add_parser(commands) -> None:
    """`specdec export`: a trained head in another tool's format."""
    export = commands.add_parser("export", help="write a trained head in another tool's format (speculators: vLLM)")
    export.add_argument("head", help="a head directory written by `specdec train eagle3`")
    export.add_argument("--format", required=True, choices=["speculators"])
    export.add_argument("--out", required=True, help="checkpoint directory to write")
    add_target_option(export, None, "the head's target (default: the one recorded in the head)")
    export.add_argument("--verifier", default=None,
                        help="the name the checkpoint gives its target, e.g. a Hugging Face id for vLLM "
                             "(default: the target's local directory)")
    export.add_argument("--device", default="cpu")


def run(args) -> int:
    from specdec.errors import UnknownModelError
    from specdec.interop.speculators import check_exportable, export_speculators
    from specdec.models.sources.loading import load_model

    head = Path(args.head).expanduser()
    info = check_exportable(head, Path(args.out))
    try:
        target = load_model(args.target or info.target_name, device=args.device, backend="native")
    except UnknownModelError:
        if args.target:
            raise
        raise InvalidParameterError(f"{head}: its target {info.target_name!r} is not a zoo name; "
                                    "pass --target with its directory or GGUF file") from None
    out = export_speculators(head, target, Path(args.out), args.verifier)
    print(f"specdec: wrote {out} (speculators eagle3 checkpoint for {target.name})")
    return 0
