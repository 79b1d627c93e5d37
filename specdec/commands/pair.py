"""`specdec pair TARGET`: the drafters `--drafter auto` weighs for a target on this machine, what each was
measured to gain, and the one kept."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from specdec.api.options import GeneratorOptions
from specdec.cli_options import add_model_options


def add_parser(commands) -> None:
    pair = commands.add_parser("pair", help="which drafter --drafter auto keeps for a target on this machine, and "
                                            "the table of candidates it weighed")
    pair.add_argument("model", nargs="?", default=None, help="the target (as --target; default: --target's)")
    add_model_options(pair)
    pair.add_argument("--recalibrate", action="store_true", help="measure again instead of the remembered decision")
    pair.add_argument("--json", action="store_true", help="print the decision as one JSON object")


@dataclass(frozen=True)
class PairOptions:
    """The target as `generate` would load it, and whether to measure again."""

    target: GeneratorOptions  # its drafter "auto": the decision asked for
    recalibrate: bool = False
    json: bool = False

    @classmethod
    def from_args(cls, args) -> "PairOptions":
        return cls(GeneratorOptions(args.model or args.target, "auto", "auto", args.device, args.dtype, args.backend,
                                    args.weights, args.cuda_graphs, "match", args.kv_dtype),
                   args.recalibrate, args.json)


def run(pair: PairOptions) -> int:
    from specdec.models.sources.loading import load_model
    from specdec.pairing.decision import decide

    options = pair.target
    target = load_model(options.target, device=options.device, dtype=options.dtype, backend=options.backend,
                        weights=options.weights, cuda_graphs=options.cuda_graphs, kv_dtype=options.kv_dtype)
    pairing = decide(target, options.device, options.dtype, recalibrate=pair.recalibrate)
    if pair.json:
        print(json.dumps(dataclasses.asdict(pairing) | {"line": pairing.line}))
        return 0
    now = f" when calibrated, {pairing.step_ms_now:.1f} ms now" if pairing.cached and pairing.step_ms_now else ""
    print(f"target {target.name} ({target.model.weight_format} weights): one decode step {pairing.step_ms:.1f} ms{now}")
    print(f"{'':2}{'drafter':72} {'kind':15} {'draft cost':>10} {'agreement':>9} {'predicted':>9}")
    for weighed in pairing.weighed:
        mark = "* " if weighed.spec == pairing.chosen else "  "
        if weighed.problem:
            print(f"{mark}{weighed.spec:72} {weighed.kind:15} not weighed: {weighed.problem}")
            continue
        print(f"{mark}{weighed.spec:72} {weighed.kind:15} {weighed.draft_cost:>9.2f}x {weighed.agreement:>9.2f} "
              f"{weighed.predicted_speedup:>8.2f}x")
    for reason in pairing.left_out:
        print(f"  left out: {reason}")
    if pairing.cached:
        realized = (f", realized {pairing.realized:.2f}x (median, tokens at the step timed at each start over their "
                    "rounds' time)") if pairing.realized else ""
        print(f"runs since the calibration: {pairing.runs}{realized}, predicted {pairing.predicted:.2f}x")
    print(pairing.line)
    return 0
