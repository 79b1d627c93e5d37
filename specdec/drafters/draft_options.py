"""Options of a draft model after '@' (draft:MODEL@..., quant:FORMAT@...): confidence=C, vocab=N, context=N,
and for draft models weights=FORMAT. The registry parses the spec; here its values become typed options."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import LoadedModel


@dataclasses.dataclass(frozen=True)
class DraftOptions:
    """A draft model's options after '@' (draft:MODEL@..., quant:FORMAT@...)."""

    confidence: float = 0.0  # confidence=C: stop drafting when the top probability falls below C
    vocab: int | None = None  # vocab=N: the draft's LM head computes only ids < N
    context: int | None = None  # context=N: the draft prefills only the prompt's last N tokens
    weights: str | None = None  # weights=FORMAT (draft models): the draft's weight format, not the target's


def draft_options(options: Mapping[str, float | int | str], kind: str = "draft") -> DraftOptions:
    """A spec's {"confidence": C, "vocab": N, "context": N, "weights": FORMAT} (any of them, parsed and typed
    by the registry) as DraftOptions; `kind` names the drafter in errors."""
    from specdec.models.quantized.packed_linear import parse_weight_format

    if "weights" in options:
        try:
            parse_weight_format(str(options["weights"]))
        except ValueError as error:
            raise InvalidParameterError(f"{kind} drafter: {error}") from None
    options = DraftOptions(**options)  # the registry checked the keys: they are the fields' names
    if not 0 <= options.confidence < 1:
        raise InvalidParameterError(f"{kind} drafter: the early-exit confidence must be in [0, 1)")
    if options.context is not None and options.context < 1:
        raise InvalidParameterError(f"{kind} drafter: context=N needs N >= 1 prompt tokens")
    return options


def check_draft_spec(spec) -> None:
    """InvalidParameterError for a spec.DrafterSpec's draft options out of range."""
    draft_options(spec.options, spec.kind)


def with_head_vocab(draft: LoadedModel, head_vocab: int | None, kind: str = "draft") -> LoadedModel:
    """The draft with an LM head over ids < head_vocab only (vocab=N), or as it is."""
    if head_vocab is None:
        return draft
    from specdec.models.derived import head_prefix_copy
    from specdec.models.llama import LlamaForCausalLM

    if not isinstance(draft.model, LlamaForCausalLM):
        raise InvalidParameterError(f"{kind} drafter: vocab=N needs the native backend")
    try:
        return dataclasses.replace(draft, model=head_prefix_copy(draft.model, head_vocab))
    except ValueError as error:
        raise InvalidParameterError(f"{kind} drafter: vocab={head_vocab}: {error}") from None
