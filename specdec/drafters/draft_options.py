"""Options of a draft model after '@' (draft:MODEL@..., quant:FORMAT@...): confidence=C, vocab=N, context=N, start=N,
and for draft models weights=FORMAT and adapter=DIR. The registry reads the keys and their types from these dataclasses."""

from __future__ import annotations

import dataclasses

from specdec.errors import InvalidParameterError
from specdec.models.adapters import check_adapter_dir
from specdec.models.quantized.packed_linear import parse_weight_format
from specdec.models.sources.loading import LoadedModel


@dataclasses.dataclass(frozen=True)
class DraftOptions:
    """A draft's options after '@' (quant:FORMAT@...; draft:MODEL@... adds weights=)."""

    confidence: float = 0.0  # confidence=C: stop drafting when the top probability falls below C
    vocab: int | None = None  # vocab=N: the draft's LM head computes only ids < N
    context: int | None = None  # context=N: the draft prefills only the prompt's last N tokens
    # start=N: its first proposal prefills only the last N committed tokens (then every token it sees
    # stays): a cheap start for a draft asked only once lookup has drafted the first tokens
    start: int | None = None

    def __post_init__(self):
        if not 0 <= self.confidence < 1:
            raise InvalidParameterError("the early-exit confidence must be in [0, 1)")
        if self.context is not None and self.context < 1:
            raise InvalidParameterError("context=N needs N >= 1 prompt tokens")
        if self.start is not None and self.start < 1:
            raise InvalidParameterError("start=N needs N >= 1 tokens")


@dataclasses.dataclass(frozen=True)
class DraftModelOptions(DraftOptions):
    """draft:MODEL@...: a draft model's options."""

    weights: str | None = None  # weights=FORMAT: the draft's weight format, not the target's
    # adapter=DIR: a LoRA adapter (PEFT's format; `specdec train distill` writes one) merged into the draft's
    # float weights before they are quantized
    adapter: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.adapter is not None:
            check_adapter_dir(self.adapter)
        if self.weights is not None:
            try:
                parse_weight_format(self.weights)
            except ValueError as error:
                raise InvalidParameterError(str(error)) from None


def with_head_vocab(draft: LoadedModel, head_vocab: int | None, kind: str = "draft") -> LoadedModel:
    """The draft with an LM head over ids < head_vocab only (vocab=N), or as it is."""
    from specdec.models.derived import head_prefix_copy  # the spec parser imports this module: see commands/
    from specdec.models.llama import LlamaForCausalLM

    if head_vocab is None:
        return draft
    if not isinstance(draft.model, LlamaForCausalLM):
        raise InvalidParameterError(f"{kind} drafter: vocab=N needs the native backend")
    try:
        return dataclasses.replace(draft, model=head_prefix_copy(draft.model, head_vocab))
    except ValueError as error:
        raise InvalidParameterError(f"{kind} drafter: vocab={head_vocab}: {error}") from None
