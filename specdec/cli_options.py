"""Option groups the `specdec` commands share, each declared once: the target, how it runs, speculation,
and sampling; and the one place a command's arguments become a `GenerationRequest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.api.options import GeneratorOptions
from specdec.api.reasoning import REASONING_FORMATS
from specdec.api.request import GenerationRequest
from specdec.api.structured import GrammarSpec
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import K_HELP, KSetting
from specdec.errors import InvalidParameterError

KV_DTYPE_HELP = ("the target's KV cache elements: auto (default: the model's dtype), float32, bfloat16 or float16 "
                 "(half the memory and the bytes a pass deep in a long context reads; speculative output stays "
                 "equal to plain decoding with the same setting)")
NO_CUDA_GRAPHS_HELP = "on a GPU, run every forward eagerly instead of replaying CUDA graphs (debugging, comparison)"
WEIGHTS_HELP = ("auto (default: a model from a GGUF file runs on the file's own quantized blocks, as llama.cpp "
                "runs them, a bf16/fp16 checkpoint on bf16/fp16 weights, where the CPU kernel serves it; else "
                "float32), float32, bf16 or fp16 (two-byte weights widened to float32 in the kernel), int8 "
                "(weight-only), int4[:GROUP] or int7[:GROUP] (low-bit groups x int8 activations), gguf; all but "
                "float32 run on CPU kernels. Speculation is exact to the model as loaded")
ACCEPTANCE_HELP = ("how sampled drafts are judged: match (default): with a seed, exactly the text plain sampling "
                   "gives; rejection: accepts more of a sampling draft model's tokens, exact in distribution only")


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (`specdec: error: ...`, exit 2) instead of a usage block, as every
    other error of the CLI: a user sees what is wrong, and `--help` shows the usage."""

    def error(self, message: str):
        command = self.prog.removeprefix("specdec").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"specdec: error: {where}{message} (see {self.prog} --help)\n")


def k_argument(text: str) -> KSetting:
    """--k's type: an integer, 'auto' or 'auto:N', parsed."""
    try:
        return KSetting.parse(text)
    except InvalidParameterError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def threads_argument(text: str) -> int:
    """--threads' type: a whole number of threads >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of threads (a whole number >= 1)")
    return int(text)


def use_threads(threads: int | None) -> None:
    """Run torch and specdec's kernels (which take torch's thread count) on `threads` threads (None: torch's
    default, the cores this process may use)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def add_target_option(parser: argparse.ArgumentParser, default: str | None = "default",
                      help_text: str = "zoo name, Hugging Face directory, .gguf file, ollama:NAME[:TAG], "
                                       "hf:ORG/REPO[/FILE], lmstudio:PUBLISHER/REPO[/FILE] or a name in "
                                       "--models-dir") -> None:
    """--target: the model a command runs ("default": the zoo's default model; None: no default)."""
    from specdec.models.sources.zoo import DEFAULT_MODEL

    parser.add_argument("--target", default=DEFAULT_MODEL if default == "default" else default, help=help_text)


MODELS_DIR_HELP = ("a folder of your models (.gguf files, model directories): --target NAME finds NAME.gguf "
                   "there; also $SPECDEC_MODELS_DIR")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The target and how it runs: one set of flags for generate, serve, bench and certify."""
    group = parser.add_argument_group("model")
    add_target_option(group)
    group.add_argument("--device", default="cpu", help="cpu or cuda")
    group.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    group.add_argument("--backend", default="auto", help="auto, native or transformers")
    group.add_argument("--weights", default="auto", help=WEIGHTS_HELP)
    group.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false", help=NO_CUDA_GRAPHS_HELP)
    group.add_argument("--kv-dtype", default="auto", help=KV_DTYPE_HELP)
    group.add_argument("--threads", type=threads_argument, default=None,
                       help="CPU threads for the model's kernels (default: the cores this process may use; "
                            "llama.cpp's -t; bench's llama.cpp peers run with as many)")
    group.add_argument("--models-dir", default=None, help=MODELS_DIR_HELP)


def add_k_option(parser) -> None:
    parser.add_argument("--k", type=k_argument, default=KSetting(), help=K_HELP)


def add_speculation_options(parser: argparse.ArgumentParser) -> None:
    """The drafter, K and the acceptance rule, for generate, serve and certify (bench takes a list of
    drafters)."""
    from specdec.core.verify import ACCEPTANCE_RULES
    from specdec.drafters import specs_help

    group = parser.add_argument_group("speculation")
    group.add_argument("--drafter", default="auto",
                       help=f"{specs_help()}; auto (the default): the candidates for the target calibrated on this "
                            "machine once, and the one that pays kept (`specdec pair TARGET` shows them)")
    add_k_option(group)
    group.add_argument("--acceptance", choices=ACCEPTANCE_RULES, default="match", help=ACCEPTANCE_HELP)


def add_sampling_options(parser: argparse.ArgumentParser, temperature: float = 0.0, title: str = "sampling",
                         seed: bool = True, seed_default: int | None = None) -> None:
    """Temperature, top-k/p, min-p, repetition penalty and (unless seed=False, where a command's --seed
    means something else) the seed: generate, bench and certify."""
    group = parser.add_argument_group(title)
    group.add_argument("--temperature", type=float, default=temperature,
                       help=f"0 = greedy (default {temperature:g})")
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--min-p", type=float, default=0.0)
    group.add_argument("--repetition-penalty", type=float, default=1.0)
    if seed:
        group.add_argument("--seed", type=int, default=seed_default,
                           help="with sampling: the text is the one plain sampling gives for this seed")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """What the output must match (one of them): a JSON schema, a regex, a grammar file."""
    group = parser.add_argument_group("structured output (exact: the target's law masked to the grammar)")
    chosen = group.add_mutually_exclusive_group()
    chosen.add_argument("--json-schema", metavar="FILE", default=None,
                        help="a JSON schema file the output must validate against ('object': any JSON object)")
    chosen.add_argument("--regex", default=None, help="a regular expression the whole output must match")
    chosen.add_argument("--grammar", metavar="FILE", default=None,
                        help="a grammar file: llama.cpp's GBNF (.gbnf) or llguidance's Lark (.lark)")


def add_reasoning_format_option(parser: argparse.ArgumentParser, split: str, kept: str) -> None:
    """--reasoning-format: whether a thinking model's <think> block is split from its chat answer
    (api/reasoning.py), as llama-server's option of that name; `split`/`kept` say what becomes of it."""
    parser.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                        help=f"a thinking model's <think> block: {split} (auto: where the chat template writes such "
                             f"blocks; deepseek: always) or {kept} (none)")


def grammar_from_args(args) -> GrammarSpec | None:
    """The output's grammar from --json-schema / --regex / --grammar (checked: a bad one is one line)."""
    if args.regex is not None:
        return GrammarSpec("regex", args.regex)
    path = args.json_schema or args.grammar
    if path is None:
        return None
    if args.json_schema == "object":
        return GrammarSpec("json_object")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidParameterError(f"{path}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    if args.json_schema:
        return GrammarSpec("json_schema", text)
    return GrammarSpec("lark" if path.endswith(".lark") else "gbnf", text)


def sampling_from_args(args) -> SamplingParams:
    return SamplingParams.of(args)


def generator_options_from_args(args) -> GeneratorOptions:
    """The generator a command's model and speculation flags describe, checked (nothing loaded yet)."""
    return GeneratorOptions(args.target, args.drafter, args.k, args.device, args.dtype, args.backend, args.weights,
                            args.cuda_graphs, args.acceptance, args.kv_dtype)


def request_from_args(args, prompt) -> GenerationRequest:
    """`specdec generate`'s request (prompt: the text, or "" for a template that batch files fill in)."""
    return GenerationRequest(prompt, args.max_new_tokens, sampling_from_args(args), tuple(args.stop), args.seed,
                             args.chat, grammar=grammar_from_args(args))


def read_prompt_argument(prompt: str) -> str:
    """The prompt argument, or standard input for '-'."""
    if prompt != "-":
        return prompt
    try:
        return sys.stdin.read()
    except UnicodeDecodeError:
        raise InvalidParameterError("standard input is not UTF-8 text") from None
