"""Replicas on Ray Serve: N copies of the specdec server behind Ray's HTTP proxy, one endpoint.

Each replica is the same FastAPI app `specdec serve` runs (same routes, streaming, errors, /metrics),
built inside the replica's process, so each loads the model once. Ray routes requests between replicas,
restarts one that dies, and scales them with an autoscaling config; specdec adds nothing of its own.

Two ways in:
  specdec serve --replicas 2 [--autoscaling '{"min_replicas": 1, "max_replicas": 4}'] ...
  serve run specdec.server.ray_app:app_builder target=smollm2-135m-instruct replicas=2   (Ray's CLI)
Ray is an optional extra: `pip install -e '.[ray]'`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field

import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.api.options import GeneratorOptions
from specdec.errors import InvalidParameterError
from specdec.models.sources.zoo import DEFAULT_MODEL
from specdec.server.app import ServerSettings, create_app

APP_NAME = "specdec"


@dataclass(frozen=True)
class ReplicaSpec:
    generator: GeneratorOptions  # what each replica loads
    settings: ServerSettings  # model_name None: the target's name
    replicas: int = 2
    autoscaling: dict | None = None  # Ray Serve's autoscaling_config (then `replicas` is its initial count)
    threads_per_replica: int | None = None  # torch threads in each replica (None: the CPUs shared out)
    extra: dict = field(default_factory=dict)  # more ray.serve.deployment options, passed through


def require_ray():
    try:
        from ray import serve
    except ImportError:
        raise InvalidParameterError("replicas need Ray Serve: pip install 'specdec[ray]' "
                                    "(or pip install -e '.[ray]' in a checkout)") from None
    return serve


def build_replica_app(spec: ReplicaSpec):
    """Runs in each replica's process: load the model and build the server's app."""
    threads = spec.threads_per_replica or max(1, (os.cpu_count() or 1) // max(1, spec.replicas))
    torch.set_num_threads(threads)  # replicas share the machine: oversubscribed threads slow every one
    generator = SpeculativeGenerator.from_options(spec.generator)
    settings = dataclasses.replace(spec.settings, model_name=spec.settings.model_name or generator.target.name)
    return create_app(generator, settings)


class SpecdecReplica:
    """One replica: Ray builds its routes from the app __serve_build_asgi_app__ returns, in its process."""

    def __init__(self, spec: ReplicaSpec):
        self.spec = spec

    def __serve_build_asgi_app__(self):
        return build_replica_app(self.spec)


def application(spec: ReplicaSpec):
    """The Ray Serve application (bind()-ed deployment) for `spec`."""
    serve = require_ray()
    if spec.replicas < 1:
        raise InvalidParameterError("--replicas must be at least 1")
    cpus = os.cpu_count() or 1
    options: dict = {
        "name": APP_NAME,
        # a replica takes what one specdec server takes: its active generations plus its queue
        "max_ongoing_requests": spec.settings.max_active + spec.settings.max_queue,
        "ray_actor_options": {"num_cpus": min(1.0, cpus / spec.replicas)},
        **spec.extra,
    }
    if spec.autoscaling:
        options["autoscaling_config"] = {"initial_replicas": spec.replicas, **spec.autoscaling}
    else:
        options["num_replicas"] = spec.replicas
    return serve.deployment(serve.ingress()(SpecdecReplica), **options).bind(spec)


APP_BUILDER_KEYS = ("target", "drafter", "k", "device", "weights", "replicas", "max_active", "max_queue",
                    "model_name", "api_key")


def app_builder(args: dict):
    """For Ray's own CLI: `serve run specdec.server.ray_app:app_builder target=NAME replicas=2 drafter=ngram`.
    Keys: APP_BUILDER_KEYS."""
    return application(replica_spec_of(args))


def replica_spec_of(args: dict) -> ReplicaSpec:
    """app_builder's keys as the typed options every replica loads from (the same GeneratorOptions and
    ServerSettings `specdec serve --replicas` builds from its flags), checked before Ray starts anything."""
    unknown = set(args) - set(APP_BUILDER_KEYS)
    if unknown:
        raise InvalidParameterError(f"unknown app_builder arguments {sorted(unknown)} (known: {list(APP_BUILDER_KEYS)})")
    try:
        numbers = {key: int(args.get(key, default)) for key, default in
                   (("replicas", 2), ("max_active", 4), ("max_queue", 64))}
    except ValueError as error:
        raise InvalidParameterError(f"app_builder: {error}") from None
    generator = GeneratorOptions(args.get("target", DEFAULT_MODEL), args.get("drafter", "auto"),
                                 args.get("k", "auto"), args.get("device", "cpu"), weights=args.get("weights", "auto"))
    settings = ServerSettings(args.get("model_name"), numbers["max_active"], numbers["max_queue"],
                              api_key=args.get("api_key"))
    return ReplicaSpec(generator, settings, numbers["replicas"])


def parse_autoscaling(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParameterError(f"--autoscaling: not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise InvalidParameterError("--autoscaling: expected a JSON object such as "
                                    '\'{"min_replicas": 1, "max_replicas": 4}\'')
    return value


def run_replicas(spec: ReplicaSpec, host: str, port: int) -> int:
    """Start a local Ray instance, run the replicas behind Ray's proxy on host:port, and wait for SIGINT or
    SIGTERM; then shut Serve and Ray down."""
    import ray

    serve = require_ray()
    app = application(spec)  # refuses bad settings before Ray starts
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        serve.start(http_options={"host": host, "port": port}, detached=False)
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"specdec: serving with {spec.replicas} replicas on Ray Serve at http://{host}:{port}/v1",
              file=sys.stderr, flush=True)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
