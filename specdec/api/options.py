"""How a generator loads: target, drafter, K and runtime settings, checked before anything is loaded.

`SpeculativeGenerator.from_pretrained` takes these; the CLI (generate, serve, certify) and the server's
replicas build them from their own flags first, so every mistake a user can make in them is one line
within a second or two, not after a model has spent half a minute loading. Checks read no model file:
a name must be a zoo model, a model directory or a GGUF file that exists; a drafter spec must parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.speculation_length import KSetting
from specdec.core.verify import Acceptance
from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import check_load_options, check_model_spec


@dataclass(frozen=True)
class GeneratorOptions:
    target: str
    drafter: str = "default"  # a drafter spec (drafters/registry.py), "default" (the best for the target), "none"
    k: KSetting = KSetting()  # given as an integer, 'auto' or 'auto:N' too: parsed here
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "auto"
    weights: str = "auto"
    cuda_graphs: bool = True
    acceptance: Acceptance = Acceptance.MATCH  # given by name too: parsed here
    kv_dtype: str = "auto"  # the target's KV cache elements: auto (the model's dtype), float32, bfloat16, float16

    def __post_init__(self):
        object.__setattr__(self, "k", KSetting.parse(self.k))
        object.__setattr__(self, "acceptance", Acceptance.parse(self.acceptance))
        check_load_options(self.device, self.dtype, self.backend, self.weights, self.kv_dtype)
        check_model_spec(self.target)
        check_drafter_spec(self.drafter)


def check_drafter_spec(spec: str) -> None:
    """Every part of a drafter spec parses (drafters/registry.py), and a draft model names a model."""
    from specdec.drafters.registry import parse_spec

    if spec in ("default", "none"):
        return
    for part in spec.split("+"):
        if part == "none":
            raise InvalidParameterError(f"drafter {spec!r}: 'none' cannot be combined")
        parsed = parse_spec(part)
        if parsed.kind == "draft":
            check_model_spec(parsed.argument)
