"""The `specdec` command: generate, pull, models.

Errors a user can cause print one line (`specdec: error: ...`) and exit 2;
they never show a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from specdec.cli_options import (MODELS_DIR_HELP, OneLineParser, add_k_option, add_model_options, add_output_options,
                                 add_reasoning_format_option, use_threads,
                                 add_sampling_options, add_speculation_options, add_target_option,
                                 generator_options_from_args, read_prompt_argument, request_from_args)
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.api.reasoning import reasoning_for, split_reasoning
from specdec.cli_reasoning import AnswerPrinter

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="specdec", description="Exact speculative decoding for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)

    add_generate_parser(commands)
    from specdec.certify.command import add_certify_parser

    add_certify_parser(commands)
    from specdec.pairing.command import add_pair_parser

    add_pair_parser(commands)
    pull = commands.add_parser("pull", help="download, verify and convert zoo models")
    pull.add_argument("names", nargs="+", metavar="name")
    models = commands.add_parser("models", help="list zoo models, pulled or not (--local: every model found on "
                                                "this machine, and which can draft for which)")
    models.add_argument("--local", action="store_true",
                        help="list the models in Ollama's store, the Hugging Face cache, LM Studio's folder, "
                             "--models-dir and the pulled zoo: architecture, parameters, quantization, size, "
                             "tokenizer fingerprint, drafts")
    models.add_argument("--models-dir", default=None, help=MODELS_DIR_HELP)
    for add in (add_serve_parser, add_bench_parser, add_bench_serve_parser, add_analyze_parser, add_datastore_parser,
                add_export_parser, add_train_parser):
        add(commands)
    return parser


def add_generate_parser(commands) -> None:
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


def add_serve_parser(commands) -> None:
    """`specdec serve`: the OpenAI-compatible server."""
    serve = commands.add_parser("serve", help="serve an OpenAI-compatible HTTP API")
    add_model_options(serve)
    add_speculation_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model-name", default=None, help="the model id clients send (default: the target's name)")
    serve.add_argument("--max-active", type=int, default=16,
                       help="generations run together, their rounds batched (more: throughput; fewer: per-stream speed)")
    serve.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more get HTTP 503")
    serve.add_argument("--kv-memory", type=float, default=None, metavar="MIB",
                       help="MiB of KV cache the running generations may hold together; more requests wait "
                            "(default: no limit beyond --max-active)")
    serve.add_argument("--prefill-chunk", type=int, default=512, metavar="TOKENS",
                       help="prefill work per step, in prompt tokens at the start of a prompt (a token deep in "
                            "a long prompt counts for more: its attention reads every earlier key); shortest "
                            "prompt first (more: batches refill sooner; fewer: shorter stalls of running streams "
                            "and of requests behind a long prompt; default 512)")
    serve.add_argument("--prefix-cache", type=float, default=512, metavar="MIB",
                       help="MiB of prompts' keys and values kept so that later prompts sharing a prefix "
                            "(a system prompt, a chat history) skip computing it; 0: off (default 512)")
    serve.add_argument("--default-max-tokens", type=int, default=512, help="when a request sets no max_tokens")
    serve.add_argument("--max-tokens-cap", type=int, default=None, metavar="N",
                       help="the most tokens one request may generate: a larger max_tokens gets HTTP 400, a larger "
                            "n_predict (/infill) is cut to it (default: the model's context)")
    serve.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on every route (default: $SPECDEC_API_KEY; "
                            "/health and /metrics stay open)")
    serve.add_argument("--no-tool-grammar", action="store_true",
                       help="leave tool_choice \"auto\" unconstrained (default: the answer is text or calls in the "
                            "chat template's format whose arguments match their schema)")
    add_reasoning_format_option(serve, "returned as reasoning_content", "left in content")
    serve.add_argument("--max-request-bytes", type=int, default=1 << 20, help="larger request bodies get HTTP 413")
    serve.add_argument("--max-prompt-tokens", type=int, default=None,
                       help="longer prompts get HTTP 400 (default: up to the model's context)")
    serve.add_argument("--allowed-origins", default="",
                       help="comma-separated browser origins allowed by CORS (default: none)")
    serve.add_argument("--shutdown-grace", type=float, default=30.0,
                       help="seconds in-flight requests get to finish on SIGTERM before they are cancelled")
    serve.add_argument("--replicas", type=int, default=0,
                       help="run N server replicas on Ray Serve behind its HTTP proxy (needs specdec[ray]; "
                            "default 0: one process, no Ray)")
    serve.add_argument("--autoscaling", default=None,
                       help="with --replicas: Ray Serve's autoscaling_config as JSON, e.g. "
                            "'{\"min_replicas\": 1, \"max_replicas\": 4}'")


def add_bench_parser(commands) -> None:
    """`specdec bench`: drafters against plain decoding and the peers."""
    bench = commands.add_parser("bench", help="benchmark drafters against plain decoding and transformers")
    add_model_options(bench)  # the transformers peers run the same dtype, always with float32 weights
    add_k_option(bench)
    bench.add_argument("--drafters", default="auto", help="comma-separated drafter specs ('auto': what "
                       "generate would run for this target)")
    bench.add_argument("--tasks", default="code,mt_bench", help="comma-separated: mt_bench, translation, "
                       "summarization, qa, math_reasoning, rag, code, edit (code edits: ask 256+ tokens), "
                       "longdoc (2-3k-token files quoted), longedit (a function edited inside a ~4k-token file)")
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


def add_bench_serve_parser(commands) -> None:
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


def add_analyze_parser(commands) -> None:
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


def add_datastore_parser(commands) -> None:
    """`specdec datastore build`: a retrieval datastore."""
    datastore = commands.add_parser("datastore", help="retrieval datastores for --drafter retrieval:DIR")
    datastore_commands = datastore.add_subparsers(dest="datastore_command", required=True)
    build = datastore_commands.add_parser("build", help="tokenize a corpus and index it (suffix array)")
    build.add_argument("corpus", nargs="+", help="text files or directories (walked for code and text files)")
    add_target_option(build, help_text="the model whose tokenizer the datastore uses")
    build.add_argument("--out", required=True, help="datastore directory to write")


def add_export_parser(commands) -> None:
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


def add_train_parser(commands) -> None:
    """`specdec train`: a head, or a draft model's LoRA adapter, trained on this machine."""
    from specdec.training.precision import PRECISIONS

    train = commands.add_parser("train", help="train an EAGLE, EAGLE-3 or Medusa head for a target, or distill a "
                                "draft model toward it (a LoRA adapter), on this machine")
    train.add_argument("kind", choices=["eagle", "eagle3", "medusa", "distill"])
    add_target_option(train)
    train.add_argument("--out", required=True, help="directory for head.safetensors and head.json (distill: the "
                       "adapter's files and distill.json)")
    train.add_argument("--steps", type=int, default=600)
    train.add_argument("--batch-windows", type=int, default=8, help="token windows per step")
    train.add_argument("--learning-rate", type=float, default=None, help="default: 1e-3 for heads, 2e-4 for distill")
    train.add_argument("--draft", help="distill: the draft model to distill toward the target (zoo name or directory)")
    train.add_argument("--lora-rank", type=int, default=16, help="distill: the adapter's rank")
    train.add_argument("--head-vocab", type=int, default=0, help="distill: the draft drafts with vocab=N: score ids "
                       "< N only (0: all)")
    train.add_argument("--draft-weights", default="int4:128", help="distill: the draft's weight format when the "
                       "adapter is measured drafting (as --drafter draft:MODEL@weights=FORMAT)")
    train.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head scores (most predicted first)")
    train.add_argument("--medusa-heads", type=int, default=4)
    train.add_argument("--intermediate-size", type=int, default=0, help="EAGLE layer MLP width (0: the target's)")
    train.add_argument("--feature-layers", default="", help="EAGLE-3: target layer ids to fuse, e.g. 2,15,27 "
                       "(speculators' ids: L is decoder layer L's input; default: low, middle and high)")
    train.add_argument("--code-tokens", type=int, default=160_000, help="corpus tokens of Python source")
    train.add_argument("--prose-tokens", type=int, default=80_000, help="corpus tokens of package documentation")
    train.add_argument("--generated", type=int, default=1024, help="answers the target writes itself for the corpus")
    train.add_argument("--answer-tokens", type=int, default=200, help="tokens per self-generated answer")
    train.add_argument("--window", type=int, default=256, help="tokens per training window")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu", help="cpu or cuda")
    train.add_argument("--weights", default="float32",
                       help="the target's weight format for computing the features and self-generated answers "
                       "(float32 by default; gguf: a GGUF model's own blocks, several times faster on a CPU); "
                       "the head drafts for the model whatever its format")
    train.add_argument("--precision", default="auto", choices=PRECISIONS,
                       help="the training steps' matrix products (weights, optimizer and losses stay float32); "
                       "auto: bfloat16 where the hardware multiplies bf16 natively (AMX-BF16, AVX512-BF16, CUDA), "
                       "float32 elsewhere")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "serve"]:  # `bench` itself takes options only: `bench serve` is its own command
        argv = ["bench-serve", *argv[2:]]
    args = build_parser().parse_args(argv)
    use_threads(getattr(args, "threads", None))
    if getattr(args, "models_dir", None):  # where stores.py looks for a name, for this command
        os.environ["SPECDEC_MODELS_DIR"] = args.models_dir
    try:
        commands = {"generate": cmd_generate, "pull": cmd_pull, "models": cmd_models, "bench": cmd_bench,
                    "bench-serve": cmd_bench_serve,
                    "serve": cmd_serve, "analyze": cmd_analyze, "train": cmd_train,
                    "datastore": cmd_datastore, "certify": cmd_certify, "export": cmd_export, "pair": cmd_pair}
        return commands[args.command](args)
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130


def cmd_bench_serve(args) -> int:
    from specdec.bench.serve_bench import run_serve_bench

    return run_serve_bench(args)


def cmd_certify(args) -> int:
    from specdec.certify.command import run_certify

    return run_certify(args)


def cmd_pair(args) -> int:
    from specdec.pairing.command import run_pair

    return run_pair(args)


def cmd_generate(args) -> int:
    from specdec.api.generator import SpeculativeGenerator
    from specdec.api.comparison import compare_with_plain
    from specdec.hints import comparison_hint, speculation_hint, take_unshown

    if args.input is not None or args.output is not None:
        return generate_file(args)
    if args.prompt is None:
        raise InvalidParameterError("give a prompt (or - for standard input), or --input FILE --output FILE")
    request = request_from_args(args, read_prompt_argument(args.prompt))  # all checked before anything loads
    options = generator_options_from_args(args)
    generator = SpeculativeGenerator.from_options(options)
    reasoning = answer_reasoning(generator, request, args.reasoning_format)
    printer = None if args.json else AnswerPrinter(reasoning, args.show_reasoning)
    with PrefillProgress() as progress:
        result = generator.run(request, on_chunk=printer, on_prefill=progress.update)
    comparison = compare_with_plain(generator, request, result) if args.compare else None
    if args.json:
        out = {"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
               "stats": result.stats.to_dict()}
        if reasoning is not None:  # as the server's chat replies: the block apart from the answer
            out["reasoning_content"], out["content"] = split_reasoning(result.text, reasoning)
        if comparison is not None:
            out["compare"] = comparison.to_dict()
        print(json.dumps(out))
    else:
        printer.finish()
        s = result.stats
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


def generate_file(args) -> int:
    """`generate --input prompts.jsonl --output out.jsonl` (specdec.api.batch_file)."""
    from pathlib import Path

    from specdec.api.batch_file import read_prompts, run_batch_file
    from specdec.api.generator import SpeculativeGenerator

    if args.input is None or args.output is None or args.prompt is not None:
        raise InvalidParameterError("--input and --output go together, without a prompt argument")
    if args.compare or args.json:
        raise InvalidParameterError("--compare and --json apply to one prompt, not to --input")
    if args.batch < 1:
        raise InvalidParameterError("--batch must be at least 1")
    template = request_from_args(args, "")  # each line's prompt goes in; the settings are checked now
    options = generator_options_from_args(args)
    read_prompts(Path(args.input))  # a bad file is one line before the model loads
    generator = SpeculativeGenerator.from_options(options)
    generated, skipped = run_batch_file(generator, Path(args.input), Path(args.output), template, args.batch)
    print(f"specdec: wrote {generated} results to {args.output}"
          + (f" ({skipped} already there)" if skipped else ""), file=sys.stderr)
    return 0


def cmd_serve(args) -> int:
    from specdec.errors import InvalidParameterError
    from specdec.api.generator import SpeculativeGenerator
    from specdec.server.app import ServerSettings, create_app
    from specdec.server.guard import LOOPBACK_HOSTS, is_loopback
    from specdec.server.run import bind_socket, make_server, serve_forever

    if args.replicas < 0 or (args.autoscaling and not args.replicas):
        raise InvalidParameterError("--replicas must be >= 0, and --autoscaling needs --replicas")
    generator_options = generator_options_from_args(args)  # checked before the port is taken
    settings = ServerSettings(args.model_name, args.max_active, args.max_queue, args.default_max_tokens,
                              api_key=args.api_key or None, max_request_bytes=args.max_request_bytes,
                              allowed_hosts=LOOPBACK_HOSTS if is_loopback(args.host) else None,
                              allowed_origins=tuple(o for o in args.allowed_origins.split(",") if o),
                              max_prompt_tokens=args.max_prompt_tokens, max_tokens_cap=args.max_tokens_cap,
                              kv_memory_bytes=None if args.kv_memory is None else int(args.kv_memory * 2**20),
                              prefix_cache_bytes=int(args.prefix_cache * 2**20),
                              prefill_tokens_per_step=args.prefill_chunk, tool_grammar=not args.no_tool_grammar,
                              reasoning_format=args.reasoning_format)
    sock = bind_socket(args.host, args.port)
    loopback = is_loopback(args.host)
    if not loopback and not args.api_key:
        print(f"specdec: warning: serving on {args.host}, reachable from other machines, without an API key "
              "(--api-key or SPECDEC_API_KEY)", file=sys.stderr)
    if args.replicas:  # Ray's proxy listens instead: the socket only checked that the port is free
        from specdec.server.ray_app import ReplicaSpec, parse_autoscaling, run_replicas

        sock.close()
        spec = ReplicaSpec(generator_options, settings, args.replicas, parse_autoscaling(args.autoscaling))
        return run_replicas(spec, args.host, args.port)
    generator = SpeculativeGenerator.from_options(generator_options)
    settings = dataclasses.replace(settings, model_name=settings.model_name or generator.target.name)
    server = make_server(create_app(generator, settings), args.shutdown_grace)
    host, port = sock.getsockname()[:2]
    print(f"specdec: serving {settings.model_name!r} (drafter {generator.engine.drafter_name}) "
          f"on http://{host}:{port}/v1", file=sys.stderr, flush=True)
    serve_forever(server, sock)
    return 0


def cmd_pull(args) -> int:
    from specdec.models.sources import zoo

    for name in args.names:
        print(zoo.pull(name))
    return 0


def cmd_models(args) -> int:
    from specdec.models.sources import zoo
    from specdec.paths import models_dir

    if args.local:
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


def cmd_bench(args) -> int:
    from pathlib import Path

    from specdec.bench.report import markdown, write_atomically, write_report_dir
    from specdec.bench.runner import BenchConfig, run_bench
    from specdec.bench.tasks import load_prompts
    from specdec.api.options import GeneratorOptions
    from specdec.cli_options import sampling_from_args
    from specdec.core.verify import Acceptance
    from specdec.drafters.registry import split_drafter_specs

    split = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    sampling = sampling_from_args(args)
    rules = [Acceptance.parse(rule) for rule in split(args.acceptance) or [args.acceptance]]
    for spec in split_drafter_specs(args.drafters):  # every spec checked before the target loads
        GeneratorOptions(args.target, spec, args.k, args.device, args.dtype, args.backend, args.weights,
                         kv_dtype=args.kv_dtype)
    config = BenchConfig(args.target, split_drafter_specs(args.drafters), split(args.tasks), args.limit,
                         args.max_new_tokens, sampling, args.seed, args.k, split(args.peers), args.device,
                         args.roofline_mb, args.weights, args.dtype, args.cuda_graphs, args.backend, rules,
                         args.kv_dtype)
    prompts = load_prompts(config.tasks, config.limit, Path(args.spec_bench) if args.spec_bench else None)
    results = run_bench(config, prompts)
    print(markdown(results))
    if args.json_out:
        write_atomically(Path(args.json_out), json.dumps(results.to_dict(), indent=1))
    if args.out:
        for path in write_report_dir(results, Path(args.out)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_analyze(args) -> int:
    from pathlib import Path

    from specdec.core import analysis

    if args.from_bench:
        try:
            results = json.loads(Path(args.from_bench).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecdecError(f"cannot read bench results {args.from_bench}: {exc}") from None
        fitted = analysis.fit_from_bench(results)
        print(analysis.fitted_table(fitted))
        if args.plot and fitted:
            from specdec.bench.plots import plot_tokens_per_round

            measured = [(f.method, (f.measured_tokens_per_round - 1) / f.mean_k, f.measured_tokens_per_round,
                         max(1, round(f.mean_k))) for f in fitted]
            plot_tokens_per_round(measured, Path(args.plot))
        return 0
    alphas = _alpha_list(args.alpha)
    verify = analysis.VerifyCost(slope=args.verify_slope)
    print(analysis.theory_table(alphas, args.k, args.c, verify, args.max_k))
    if args.plot:
        from specdec.bench.plots import plot_speedup_vs_k

        plot_speedup_vs_k(alphas, args.c, verify, args.max_k, Path(args.plot))
    return 0


def _alpha_list(text: str) -> list[float]:
    from specdec.errors import InvalidParameterError

    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise InvalidParameterError(f"--alpha must be a number or a comma-separated list, not {text!r}") from None




def cmd_train(args) -> int:
    from pathlib import Path

    from specdec.models.sources.loading import load_model
    from specdec.training.command import run_training
    from specdec.training.corpus import CorpusConfig
    from specdec.training.precision import resolve_precision
    from specdec.training.train import TrainConfig

    numbers = {"--steps": args.steps, "--batch-windows": args.batch_windows, "--draft-vocab": args.draft_vocab,
               "--lora-rank": args.lora_rank,
               "--medusa-heads": args.medusa_heads, "--window": args.window, "--answer-tokens": args.answer_tokens}
    for flag, value in numbers.items():
        if value < 1 or (flag == "--window" and value < 8):
            raise InvalidParameterError(f"{flag} must be at least {8 if flag == '--window' else 1}")
    if min(args.code_tokens, args.prose_tokens, args.generated, args.intermediate_size, args.head_vocab) < 0 or (
            args.learning_rate is not None and args.learning_rate <= 0):
        raise InvalidParameterError("corpus sizes, --intermediate-size and --head-vocab must be >= 0, --learning-rate > 0")
    if (args.kind == "distill") != (args.draft is not None):
        raise InvalidParameterError("--draft names the draft model distill trains, and only distill takes it")
    try:
        layers = tuple(int(item) for item in args.feature_layers.split(",") if item.strip())
    except ValueError:
        raise InvalidParameterError(f"--feature-layers {args.feature_layers!r}: expected ids like 2,15,27") from None
    if layers and args.kind != "eagle3":
        raise InvalidParameterError("--feature-layers applies to eagle3 heads only")
    out = Path(args.out)
    written = "distill.json" if args.kind == "distill" else "head.json"
    if out.exists() and not (out / written).exists() and any(out.iterdir()):
        raise InvalidParameterError(f"{out}: exists and is not a{' distilled adapter' if args.kind == 'distill' else ' head'} "
                                    "directory; choose a new --out")
    corpus = CorpusConfig(args.code_tokens, args.prose_tokens, args.generated, args.answer_tokens, window=args.window,
                          seed=args.seed)
    precision, why = resolve_precision(args.precision, args.device)
    if args.kind == "distill":
        return train_distill(args, out, corpus, precision, why)
    config = TrainConfig(args.kind, steps=args.steps, batch_windows=args.batch_windows,
                         learning_rate=args.learning_rate or 1e-3, draft_vocab_size=args.draft_vocab,
                         medusa_heads=args.medusa_heads, intermediate_size=args.intermediate_size,
                         feature_layers=layers, seed=args.seed, precision=precision)
    print(f"specdec: training steps in {precision} ({why})", file=sys.stderr)
    target = load_model(args.target, device=args.device, backend="native", weights=args.weights)
    info = run_training(args.kind, target, out, corpus, config)
    validation = info.validation
    print(f"specdec: wrote {out} ({args.kind} head for {target.name}); validation: "
          + ", ".join(f"{k} {v}" for k, v in validation.items() if isinstance(v, float))
          + f"; end to end: tau {validation['end_to_end']['tau']}, greedy exact "
          f"{validation['end_to_end']['greedy_matches_plain']}")
    return 0


def train_distill(args, out, corpus, precision: str, why: str) -> int:
    """`specdec train distill`: the draft's LoRA adapter toward the target (training/distill.py)."""
    from specdec.models.sources.loading import load_model
    from specdec.training.distill import DistillConfig, run_distillation

    config = DistillConfig(steps=args.steps, batch_windows=args.batch_windows, learning_rate=args.learning_rate or 2e-4,
                           rank=args.lora_rank, head_vocab=args.head_vocab or None, precision=precision, seed=args.seed,
                           device=args.device)
    print(f"specdec: distilling in {precision} ({why})", file=sys.stderr)
    target = load_model(args.target, device=args.device, backend="native", weights=args.weights)
    figures = run_distillation(target, args.draft, out, corpus, config, args.draft_weights)
    before, after = figures["validation"]["before"], figures["validation"]["after"]
    tau = figures["end_to_end"]
    print(f"specdec: wrote {out} (a LoRA adapter of {figures['draft']} for {target.name}); held-out agreement "
          f"{before['top1_agreement']} -> {after['top1_agreement']}, loss {before['loss']} -> {after['loss']}; "
          f"tau {tau['without']['tau']} -> {tau['with']['tau']}, greedy exact {tau['with']['greedy_matches_plain']}; "
          f"draft with --drafter draft:{args.draft}@adapter={out}")
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

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


def cmd_datastore(args) -> int:
    from pathlib import Path

    from specdec.heads.datastore import build_datastore
    from specdec.models.sources.loading import load_tokenizer, read_config, resolve_model_dir

    name, model_dir = resolve_model_dir(args.target)
    tokenizer = load_tokenizer(model_dir)
    vocab_size = int(read_config(model_dir).get("vocab_size", len(tokenizer)))
    info = build_datastore([Path(p) for p in args.corpus], tokenizer, vocab_size, Path(args.out), name)
    print(f"specdec: wrote {args.out}: {info['tokens']:,} tokens from {info['files']} files")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
