"""`specdec generate`: one prompt generated (streamed, or as JSON), or a JSONL file of prompts in batches."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.api.options import GeneratorOptions
from specdec.api.reasoning import reasoning_for, split_reasoning
from specdec.api.request import GenerationRequest
from specdec.cli_options import (add_model_options, add_output_options, add_reasoning_format_option,
                                 add_sampling_options, add_speculation_options, generator_options_from_args,
                                 read_prompt_argument, request_from_args)
from specdec.cli_reasoning import AnswerPrinter
from specdec.errors import InvalidParameterError


def add_parser(commands) -> None:
    """`specdec generate`: one prompt (or a JSONL file of them) generated, streamed or whole."""
    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt (use - to read it from standard input; none with --input)")
    add_model_options(gen)
    add_speculation_options(gen)
    gen.add_argument("--max-new-tokens", type=int, default=256)
    add_sampling_options(gen)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_output_options(gen)
    chat = gen.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt as raw text")
    add_reasoning_format_option(gen, "split from the answer", "left in it")
    gen.add_argument("--show-reasoning", action="store_true",
                     help="print a thinking model's reasoning before its answer (dimmed on a terminal); by default "
                          "only the answer is printed")
    gen.add_argument("--json", action="store_true", help="print one JSON object (text, token ids, stats)")
    gen.add_argument("--compare", action="store_true",
                     help="then decode the same prompt without speculation and print both speeds, the speedup "
                          "and whether the outputs are identical")
    gen.add_argument("--input", default=None, help="a JSONL file of prompts ({\"prompt\": ...} or "
                     "{\"messages\": [...]} a line, optional \"id\"), generated in batches; needs --output")
    gen.add_argument("--output", default=None, help="with --input: the JSONL file results are appended to; a rerun "
                     "skips the prompts it already holds")
    gen.add_argument("--batch", type=int, default=16, help="with --input: generations run together")


@dataclass(frozen=True)
class PromptFile:
    """`--input FILE --output FILE`: a JSONL file of prompts generated in batches of `batch`."""

    input: Path
    output: Path
    batch: int = 16

    def __post_init__(self):
        if self.batch < 1:
            raise InvalidParameterError("--batch must be at least 1")


@dataclass(frozen=True)
class GenerateOptions:
    """What `specdec generate` was asked, checked at construction (before any model loads): the generator,
    the request (for a file: the settings each line's prompt takes), and how the answer is shown."""

    generator: GeneratorOptions
    request: GenerationRequest
    prompts: PromptFile | None = None  # a JSONL file instead of one prompt
    json: bool = False
    compare: bool = False
    show_reasoning: bool = False
    reasoning_format: str = "auto"

    def __post_init__(self):
        if self.prompts is not None and (self.compare or self.json):
            raise InvalidParameterError("--compare and --json apply to one prompt, not to --input")

    @classmethod
    def from_args(cls, args) -> "GenerateOptions":
        prompts = None
        if args.input is not None or args.output is not None:
            if args.input is None or args.output is None or args.prompt is not None:
                raise InvalidParameterError("--input and --output go together, without a prompt argument")
            prompts = PromptFile(Path(args.input), Path(args.output), args.batch)
        elif args.prompt is None:
            raise InvalidParameterError("give a prompt (or - for standard input), or --input FILE --output FILE")
        text = "" if prompts is not None else read_prompt_argument(args.prompt)  # a file's lines go in later
        request = request_from_args(args, text)  # the request's settings first, then the model's name
        return cls(generator_options_from_args(args), request, prompts, args.json, args.compare,
                   args.show_reasoning, args.reasoning_format)


def run(options: GenerateOptions) -> int:
    from specdec.api.comparison import compare_with_plain
    from specdec.api.generator import SpeculativeGenerator

    if options.prompts is not None:
        return generate_file(options)
    generator = SpeculativeGenerator.from_options(options.generator)
    request = options.request
    reasoning = answer_reasoning(generator, request, options.reasoning_format)
    printer = None if options.json else AnswerPrinter(reasoning, options.show_reasoning)
    with PrefillProgress() as progress:
        result = generator.run(request, on_chunk=printer, on_prefill=progress.update)
    comparison = compare_with_plain(generator, request, result) if options.compare else None
    if options.json:
        out = {"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
               "stats": result.stats.to_dict()}
        if reasoning is not None:  # as the server's chat replies: the block apart from the answer
            out["reasoning_content"], out["content"] = split_reasoning(result.text, reasoning)
        if comparison is not None:
            out["compare"] = comparison.to_dict()
        print(json.dumps(out))
    else:
        print_summary(printer, result.stats, comparison)
    return 0


def print_summary(printer: AnswerPrinter, s, comparison) -> None:
    """After a streamed answer: its figures on stderr, the comparison with plain decoding, a hint once."""
    from specdec.hints import comparison_hint, speculation_hint, take_unshown

    printer.finish()
    print()
    if printer.omitted:
        print("specdec: the model's reasoning was left out (--show-reasoning prints it)", file=sys.stderr)
    print(f"[{s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, drafter {s.drafter}, "
          f"tau {s.tau:.2f}, acceptance {s.acceptance_rate:.0%}, {s.draft_ms_per_round:.1f} + "
          f"{s.verify_ms_per_round:.1f} ms per round (draft + verify), drafter memory "
          f"{s.drafter_memory_bytes / 1e6:.1f} MB"
          + (f", {s.experts_per_pass:.1f} experts a layer per verification" if s.experts_per_pass else "") + "]",
          file=sys.stderr)
    if comparison is not None:
        print(comparison.line(), file=sys.stderr)
    hint = speculation_hint(s)
    if hint is None and comparison is not None:
        hint = comparison_hint(comparison, s)
    if hint is not None and take_unshown(hint[0]):
        print(f"specdec: hint: {hint[1]}", file=sys.stderr)


def generate_file(options: GenerateOptions) -> int:
    """`generate --input prompts.jsonl --output out.jsonl` (specdec.api.batch_file)."""
    from specdec.api.batch_file import read_prompts, run_batch_file
    from specdec.api.generator import SpeculativeGenerator

    prompts = options.prompts
    read_prompts(prompts.input)  # a bad file is one line before the model loads
    generator = SpeculativeGenerator.from_options(options.generator)
    generated, skipped = run_batch_file(generator, prompts.input, prompts.output, options.request, prompts.batch)
    print(f"specdec: wrote {generated} results to {prompts.output}"
          + (f" ({skipped} already there)" if skipped else ""), file=sys.stderr)
    return 0


def answer_reasoning(generator, request, setting: str):
    """How a chat answer's <think> block is split (api/reasoning.py), or None: raw prompts and models whose
    template writes no such block (setting "auto") print the text as it comes."""
    chat = request.chat if request.chat is not None else (not isinstance(request.prompt, str)
                                                          or generator.target.has_chat_template)
    return reasoning_for(generator.target.tokenizer, setting) if chat else None


class PrefillProgress:
    """While a long prompt is prefilled: a progress bar on a terminal, or off one (a pipe, a log) a line every
    LINE_SECONDS, so a long wait never looks like a hang; nothing for short prompts. Closed when the first
    text arrives or on Ctrl-C."""

    MIN_TOKENS = 2048  # shorter prompts prefill in a second or two: nothing shown
    LINE_SECONDS = 5.0

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar = None
        self.last_line: float | None = None

    def update(self, done: int, total: int) -> None:
        if total < self.MIN_TOKENS:
            return
        if self.stream.isatty():
            self._update_bar(done, total)
        else:
            self._update_lines(done, total)

    def _update_bar(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="prompt", unit="tok", leave=False, file=self.stream)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def _update_lines(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.last_line is None or now - self.last_line >= self.LINE_SECONDS or done >= total:
            print(f"specdec: reading the prompt: {done}/{total} tokens", file=self.stream, flush=True)
            self.last_line = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "PrefillProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
