"""Options of a draft model after '@' (draft:MODEL@..., quant:FORMAT@...): confidence=C, vocab=N, context=N,
and for draft models weights=FORMAT."""

from __future__ import annotations

import dataclasses

from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import LoadedModel


@dataclasses.dataclass(frozen=True)
class DraftOptions:
    """A draft model's options after '@' (draft:MODEL@..., quant:FORMAT@...)."""

    min_confidence: float = 0.0  # confidence=C: stop drafting when the top probability falls below C
    head_vocab: int | None = None  # vocab=N: the draft's LM head computes only ids < N
    context: int | None = None  # context=N: the draft prefills only the prompt's last N tokens
    weights: str | None = None  # weights=FORMAT (draft models): the draft's weight format, not the target's


def parse_draft_options(options: str, kind: str = "draft") -> DraftOptions:
    """'confidence=C,vocab=N,context=N[,weights=FORMAT]' (any of them; a bare C is a confidence, as before);
    `kind` names the drafter in errors."""
    from specdec.models.quantized.packed_linear import parse_weight_format

    values: dict[str, float | int | str] = {}
    for item in filter(None, options.split(",")):
        key, equals, value = item.partition("=")
        key, value = (key, value) if equals else ("confidence", item)
        try:
            if key == "confidence":
                values["min_confidence"] = float(value)
            elif key == "vocab":
                values["head_vocab"] = int(value)
            elif key == "context":
                values["context"] = int(value)
            elif key == "weights" and kind == "draft":
                parse_weight_format(value)
                values["weights"] = value
            else:
                known = "confidence=C, vocab=N, context=N" + (", weights=FORMAT" if kind == "draft" else "")
                raise InvalidParameterError(f"{kind} drafter: unknown option {key!r} ({known})")
        except ValueError as error:
            message = str(error) if key == "weights" else f"{item!r} is not a number"
            raise InvalidParameterError(f"{kind} drafter: {message}") from None
    options = DraftOptions(**values)
    if not 0 <= options.min_confidence < 1:
        raise InvalidParameterError(f"{kind} drafter: the early-exit confidence must be in [0, 1)")
    if options.context is not None and options.context < 1:
        raise InvalidParameterError(f"{kind} drafter: context=N needs N >= 1 prompt tokens")
    return options


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
