"""`specdec serve`: the HTTP server (OpenAI, Anthropic and llama-server APIs, the page), one process or Ray
Serve replicas."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from specdec.api.options import GeneratorOptions
from specdec.cli_options import (add_model_options, add_reasoning_format_option, add_speculation_options,
                                 generator_options_from_args)
from specdec.errors import InvalidParameterError

if TYPE_CHECKING:  # the server's modules load when the command runs (commands/__init__.py)
    from specdec.server.state import ServerSettings


def add_parser(commands) -> None:
    """`specdec serve`: the OpenAI-compatible server."""
    serve = commands.add_parser("serve", help="serve an OpenAI-compatible HTTP API")
    add_model_options(serve)
    add_speculation_options(serve)
    serve.add_argument("--host", default=None,
                       help="the address to listen on (default 127.0.0.1; where neither --host nor --port is given "
                            "and $OLLAMA_HOST is set, its address, as Ollama's server reads it)")
    serve.add_argument("--port", type=int, default=None,
                       help="the port (default 8000; 11434 is Ollama's, for its clients with nothing changed)")
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
    serve.add_argument("--prefix-cache", type=float, default=None, metavar="MIB",
                       help="MiB of prompts' keys and values kept so that later prompts sharing a prefix "
                            "(a system prompt, a chat history, an agent's 10,000-token instructions) skip "
                            "computing it; 0: off (default: an eighth of this machine's memory, 512 MiB to 2 GiB)")
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
    serve.add_argument("--local-models", action="store_true",
                       help="also serve, by the name a request's `model` gives, every model found in Ollama's "
                            "store, the Hugging Face cache, LM Studio's folder and the pulled zoo (`specdec models "
                            "--local`); with --models-dir DIR, the models there are served by name too")
    serve.add_argument("--max-loaded", type=int, default=2, metavar="N",
                       help="models served by name that stay loaded at once; the least recently used idle one "
                            "is unloaded to load another (default 2)")
    serve.add_argument("--autoscaling", default=None,
                       help="with --replicas: Ray Serve's autoscaling_config as JSON, e.g. "
                            "'{\"min_replicas\": 1, \"max_replicas\": 4}'")


@dataclass(frozen=True)
class ServeOptions:
    """What `specdec serve` was asked, checked at construction (before the port is taken or a model loads)."""

    generator: GeneratorOptions
    settings: "ServerSettings"
    host: str = "127.0.0.1"
    port: int = 8000
    # other models served by name (served name, model spec), loaded on first use: --models-dir, --local-models
    by_name: tuple[tuple[str, str], ...] = ()
    max_loaded: int = 2
    replicas: int = 0  # Ray Serve replicas (0: one process, no Ray)
    autoscaling: str | None = None  # Ray Serve's autoscaling_config as JSON
    shutdown_grace: float = 30.0

    def __post_init__(self):
        if self.replicas < 0 or (self.autoscaling and not self.replicas):
            raise InvalidParameterError("--replicas must be >= 0, and --autoscaling needs --replicas")
        if not 0 <= self.port <= 65535:
            raise InvalidParameterError(f"cannot listen on {self.host}:{self.port}: a port is in 0..65535")
        if self.shutdown_grace < 0:
            raise InvalidParameterError("--shutdown-grace must be >= 0")
        if self.max_loaded < 1:
            raise InvalidParameterError("--max-loaded must be >= 1")
        if self.by_name and self.replicas:
            raise InvalidParameterError("models served by name (--models-dir, --local-models) run in one process, "
                                        "not on --replicas")

    @classmethod
    def from_args(cls, args) -> "ServeOptions":
        from specdec.server.guard import LOOPBACK_HOSTS, is_loopback
        from specdec.server.state import ServerSettings

        host, port = listen_address(args.host, args.port, os.environ.get("OLLAMA_HOST"))
        settings = ServerSettings(args.model_name, args.max_active, args.max_queue, args.default_max_tokens,
                                  api_key=args.api_key or None, max_request_bytes=args.max_request_bytes,
                                  allowed_hosts=LOOPBACK_HOSTS if is_loopback(host) else None,
                                  allowed_origins=tuple(o for o in args.allowed_origins.split(",") if o),
                                  max_prompt_tokens=args.max_prompt_tokens, max_tokens_cap=args.max_tokens_cap,
                                  kv_memory_bytes=None if args.kv_memory is None else int(args.kv_memory * 2**20),
                                  prefix_cache_bytes=default_prefix_cache_bytes() if args.prefix_cache is None
                                  else int(args.prefix_cache * 2**20),
                                  prefill_tokens_per_step=args.prefill_chunk, tool_grammar=not args.no_tool_grammar,
                                  reasoning_format=args.reasoning_format)
        return cls(generator_options_from_args(args), settings, host, port,
                   served_by_name(args.models_dir, args.local_models), args.max_loaded, args.replicas,
                   args.autoscaling, args.shutdown_grace)


DEFAULT_HOST, DEFAULT_PORT, OLLAMA_PORT = "127.0.0.1", 8000, 11434


def default_prefix_cache_bytes() -> int:
    """An eighth of the machine's memory, within 512 MiB and 2 GiB: an agent's prompt (10,000-18,000 tokens; a
    1.5B's float32 keys and values take 57 KB a token) fits whole on a 16 GB machine, and a small one keeps
    the half-gigabyte it had."""
    return int(min(2 << 30, max(512 << 20, psutil.virtual_memory().total // 8)))


def listen_address(host: str | None, port: int | None, ollama_host: str | None) -> tuple[str, int]:
    """Where to listen: --host and --port (each defaulting alone); where neither is given, $OLLAMA_HOST as
    Ollama's server reads it ([http://]HOST[:PORT], ":PORT"; port 11434 unless given), so a user who set it
    for Ollama finds specdec at the same address; else 127.0.0.1:8000."""
    if host is not None or port is not None or not ollama_host:
        return host or DEFAULT_HOST, DEFAULT_PORT if port is None else port
    address = ollama_host.strip().split("://", 1)[-1].rstrip("/")
    if address.startswith("["):  # [IPv6]:PORT
        name, _, rest = address[1:].partition("]")
        given_port = rest.removeprefix(":")
    else:
        name, _, given_port = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
    if given_port and not given_port.isdigit():
        raise InvalidParameterError(f"OLLAMA_HOST={ollama_host!r}: the port is not a number")
    return name or DEFAULT_HOST, int(given_port) if given_port else OLLAMA_PORT


def served_by_name(models_dir: str | None, local_models: bool) -> tuple[tuple[str, str], ...]:
    """(name, spec) of every model a request may name besides the target: the folder's, or every store's."""
    from specdec.models.sources.local_models import found_models

    if not local_models and models_dir is None:
        return ()
    found = [model for model in found_models() if local_models or model.store == "models-dir"]
    return tuple((model.name, model.name if model.store != "models-dir" else str(model.path)) for model in found)


def run(options: ServeOptions) -> int:
    from specdec.api.generator import SpeculativeGenerator
    from specdec.server.app import create_app
    from specdec.server.guard import is_loopback
    from specdec.server.run import bind_socket, make_server, serve_forever
    from specdec.server.served_models import ModelCatalog

    sock = bind_socket(options.host, options.port)
    if not is_loopback(options.host) and not options.settings.api_key:
        print(f"specdec: warning: serving on {options.host}, reachable from other machines, without an API key "
              "(--api-key or SPECDEC_API_KEY)", file=sys.stderr)
    if options.replicas:  # Ray's proxy listens instead: the socket only checked that the port is free
        from specdec.server.ray_app import ReplicaSpec, parse_autoscaling, run_replicas

        sock.close()
        spec = ReplicaSpec(options.generator, options.settings, options.replicas, parse_autoscaling(options.autoscaling))
        return run_replicas(spec, options.host, options.port)
    generator = SpeculativeGenerator.from_options(options.generator)
    settings = dataclasses.replace(options.settings, model_name=options.settings.model_name or generator.target.name)
    catalog = ModelCatalog(dict(options.by_name), options.generator, options.max_loaded) if options.by_name else None
    app = create_app(generator, settings, catalog)
    server = make_server(app, options.shutdown_grace)
    host, port = sock.getsockname()[:2]
    print(f"specdec: serving {settings.model_name!r} (drafter {generator.engine.drafter_name}) "
          f"on http://{host}:{port}/v1 (Ollama's API: http://{host}:{port}/api)" + (f", and {len(catalog.models)} more by name (at most {catalog.max_loaded} "
                                           "loaded at once)" if catalog else ""), file=sys.stderr, flush=True)
    cache = app.state.scheduler.runner.prefix_cache
    if cache is not None:  # what an agent's prompts need to know: how long a prompt the cache keeps whole
        print(f"specdec: prefix cache {settings.prefix_cache_bytes / 2**20:.0f} MiB: about {cache.tokens_held():,} tokens "
              f"of this model's keys and values (--prefix-cache)", file=sys.stderr, flush=True)
    serve_forever(server, sock)
    return 0
