"""`specdec certify`: its options and the run (the CLI's main dispatches here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.errors import InvalidParameterError

EXIT_FAILED = 1


def add_certify_parser(commands) -> None:
    from specdec.cli_options import add_model_options, add_sampling_options, add_speculation_options

    certify = commands.add_parser(
        "certify", help="check that a speculative configuration decodes exactly as its target (greedy and sampled)")
    add_model_options(certify)
    add_speculation_options(certify)
    # its seeds are the draws' (statistics below); 0 runs the greedy checks only
    add_sampling_options(certify, temperature=0.7, title="sampling (the configuration under test)", seed=False)
    group = certify.add_argument_group("prompts")
    group.add_argument("--tasks", default="code,mt_bench,qa",
                       help="benchmark tasks to take prompts from (Spec-Bench tasks need its question file; "
                            "without it, code only)")
    group.add_argument("--limit", type=int, default=2, help="prompts per task")
    group.add_argument("--prompts", default=None, help="a JSONL file of {\"prompt\": ..., \"chat\": bool} instead")
    group.add_argument("--spec-bench", default=None, help="path to Spec-Bench question.jsonl")
    group = certify.add_argument_group("statistics")
    group.add_argument("--samples", type=int, default=2000, help="draws per sampled prompt")
    group.add_argument("--alpha", type=float, default=1e-4, help="the run's false-alarm rate")
    group.add_argument("--sampled-prompts", type=int, default=2, help="how many of the prompts get sampled tests")
    group.add_argument("--joint-tokens", type=int, default=3, help="new tokens whose joint distribution is tested")
    group.add_argument("--greedy-tokens", type=int, default=64, help="new tokens compared under greedy decoding")
    group.add_argument("--tie-margin", type=float, default=1e-3,
                       help="a greedy difference where the target's top-two logits are this close is a near tie")
    group.add_argument("--seed", type=int, default=0, help="first seed of the sampled draws")
    group = certify.add_argument_group("a served configuration instead of a local one")
    group.add_argument("--endpoint", default=None,
                       help="base URL of an OpenAI-compatible server running speculation (specdec serve, llama.cpp's "
                            "server, vLLM); --target and the speculation options are then ignored")
    group.add_argument("--model", default=None, help="the model name the endpoint serves")
    group.add_argument("--reference", default=None,
                       help="base URL serving the same model without speculation (default: the endpoint itself "
                            "with speculation switched off per request, which specdec servers allow)")
    group.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    certify.add_argument("--json", action="store_true", help="print the report as one JSON object")


def certify_settings(args):
    from specdec.certify.local import CertifySettings
    from specdec.core.sampling import check_seed

    checks = [(args.samples >= 10, "--samples must be >= 10"), (0 < args.alpha < 1, "--alpha must be in (0, 1)"),
              (args.sampled_prompts >= 0, "--sampled-prompts must be >= 0"),
              (args.joint_tokens >= 1, "--joint-tokens must be >= 1"),
              (args.greedy_tokens >= 1, "--greedy-tokens must be >= 1"), (args.tie_margin >= 0, "--tie-margin must be >= 0")]
    for ok, message in checks:
        if not ok:
            raise InvalidParameterError(message)
    check_seed(args.seed)
    return CertifySettings(samples=args.samples, alpha=args.alpha, joint_tokens=args.joint_tokens,
                           greedy_tokens=args.greedy_tokens, sampled_prompts=args.sampled_prompts,
                           tie_margin=args.tie_margin, seed=args.seed)


def certify_prompts(args) -> list:
    """The prompts: a JSONL file, or the bench's tasks (code alone where Spec-Bench's file is absent)."""
    from specdec.bench.tasks import BenchPrompt, SPEC_BENCH_TASKS, find_spec_bench, load_prompts

    if args.prompts:
        try:
            lines = Path(args.prompts).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidParameterError(f"--prompts {args.prompts}: unreadable ({error})") from None
        prompts = []
        for number, line in enumerate(filter(str.strip, lines), 1):
            try:
                entry = json.loads(line)
                prompts.append(BenchPrompt("file", str(entry.get("id", number)), str(entry["prompt"]),
                                           bool(entry.get("chat", True))))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise InvalidParameterError(f"--prompts {args.prompts} line {number}: expected a JSON object "
                                            "with a \"prompt\" string") from None
        if not prompts:
            raise InvalidParameterError(f"--prompts {args.prompts}: no prompts")
        return prompts
    tasks = [task for task in args.tasks.split(",") if task]
    spec_bench = Path(args.spec_bench) if args.spec_bench else find_spec_bench()
    if spec_bench is None or not spec_bench.exists():
        dropped = [task for task in tasks if task in SPEC_BENCH_TASKS]
        if dropped:
            print(f"specdec: Spec-Bench's question file not found; certifying on code prompts only "
                  f"(not {', '.join(dropped)})", file=sys.stderr)
        tasks = ["code"]
    prompts = load_prompts(tasks, args.limit, spec_bench)
    # interleave the tasks so the first prompts (the sampled ones) are of different kinds
    by_task = [[p for p in prompts if p.task == task] for task in tasks]
    return [p for group in zip(*by_task) for p in group] + [p for group in by_task for p in group[len(min(by_task, key=len)):]]


def run_certify(args) -> int:
    from specdec.certify.local import certify_local
    from specdec.certify.summary import summary
    from specdec.api.generator import SpeculativeGenerator
    from specdec.cli_options import generator_options_from_args, sampling_from_args

    params = sampling_from_args(args)
    settings = certify_settings(args)
    options = None if args.endpoint else generator_options_from_args(args)  # checked before anything loads
    if options is not None and options.drafter.is_plain:
        raise InvalidParameterError("--drafter none: there is no speculation to certify")
    prompts = certify_prompts(args)
    if args.endpoint:
        return run_endpoint_certify(args, params, settings, prompts)
    generator = SpeculativeGenerator.from_options(options)
    if generator.drafter is None:
        raise InvalidParameterError("--drafter none: there is no speculation to certify")
    if not generator.target.has_chat_template:
        prompts = [prompt.for_base_model() for prompt in prompts]
    configuration = {
        "target": generator.target.name, "weights": generator.target.model.weight_format,
        "device": args.device, "drafter": args.drafter, "K": str(args.k), "acceptance": args.acceptance,
        **{name: value for name, value in vars(params).items()}}
    report = certify_local(generator, prompts, params, settings, configuration, progress=not args.json)
    print(json.dumps(report.to_json()) if args.json else summary(report))
    return 0 if report.passed else EXIT_FAILED


def run_endpoint_certify(args, params, settings, prompts) -> int:
    from tqdm import tqdm

    from specdec.certify.endpoint import Endpoint, certify_endpoint
    from specdec.certify.summary import summary

    if not args.model:
        raise InvalidParameterError("--endpoint needs --model, the name the server serves")
    endpoint = Endpoint(args.endpoint, args.model, args.api_key)
    configuration = {"endpoint": args.endpoint, "model": args.model,
                     **{name: value for name, value in vars(params).items()}}
    sampled = 0 if params.greedy else min(len(prompts), settings.sampled_prompts)
    with tqdm(total=len(prompts) + 2 * sampled * settings.samples, desc="certify", unit="request",
              disable=args.json) as bar:
        report = certify_endpoint(endpoint, args.reference, prompts, params, settings, configuration, bar.update)
    print(json.dumps(report.to_json()) if args.json else summary(report))
    return 0 if report.passed else EXIT_FAILED
