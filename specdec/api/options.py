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
from specdec.drafters.registry import DrafterChoice
from specdec.models.sources.loading import check_load_options, check_model_spec


@dataclass(frozen=True)
class GeneratorOptions:
    target: str
    # a drafter spec (drafters/registry.py), "auto" (calibrated for the target: specdec.pairing) or "none":
    # parsed here
    drafter: DrafterChoice = DrafterChoice(default=True, text="auto")
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
        object.__setattr__(self, "drafter", DrafterChoice.parse(self.drafter))
        if self.drafter.draft_model is not None:
            check_model_spec(self.drafter.draft_model)

