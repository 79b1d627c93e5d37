"""Drafters and the factory that builds one from a CLI-style spec string."""

from __future__ import annotations

from specdec.drafters.base import Drafter
from specdec.rounds import Draft, VerifyResult
from specdec.drafters.draft_options import DraftOptions, parse_draft_options, with_head_vocab
from specdec.errors import InvalidParameterError
from specdec.models.loading import LoadedModel

DRAFTER_SPECS = ("none | ngram | ngram:MAX_N | draft:MODEL[@confidence=C,vocab=N,context=N,weights=FORMAT] | "
                 "quant:int8|int4[:GROUP]|int7[:GROUP]|gguf[@confidence=C,vocab=N,context=N] | "
                 "layerskip[:SUBSET] | eagle[:HEAD_DIR][@depth=D,topk=W,budget=N] | medusa[:HEAD_DIR][@budget=N] | "
                 "retrieval:DATASTORE_DIR[@budget=N] | lookahead[:W,N,G] | "
                 "SPEC+SPEC (chain drafters, the first that proposes drafts: ngram+draft:MODEL)")


def make_drafter(spec: str, target: LoadedModel, device: str, dtype: str) -> Drafter | None:
    """Build the drafter named by `spec` for `target`; None means plain decoding."""
    if "+" in spec:
        from specdec.drafters.combined import CombinedDrafter

        sources = [make_drafter(part, target, device, dtype) for part in spec.split("+")]
        if any(source is None for source in sources):
            raise InvalidParameterError(f"drafter {spec!r}: 'none' cannot be combined")
        return CombinedDrafter(sources)
    kind, colon, arg = spec.partition(":")
    if "@" in kind:  # options with no argument before them: eagle@depth=4 (the shipped head)
        kind, _, options = kind.partition("@")
        arg = "@" + options + colon + arg
    if kind == "none":
        return None
    if kind == "ngram":
        from specdec.drafters.ngram import NgramDrafter

        if arg and not arg.isdigit():
            raise InvalidParameterError(f"ngram drafter: {arg!r} is not a maximum n-gram size")
        return NgramDrafter(max_ngram=int(arg) if arg else 4, never_propose=target.control_token_ids())
    if kind == "draft" and arg:
        from specdec.drafters.draft_model import DraftModelDrafter, check_same_tokenizer
        from specdec.models.loading import load_model

        model, _, options = arg.rpartition("@") if "@" in arg else (arg, "", "")
        draft_options = parse_draft_options(options)
        # a draft model runs in the target's weight format unless weights=FORMAT says otherwise: who quantized
        # the target for speed wants a draft that is as fast (an int4 target gets an int4 draft)
        weights = draft_options.weights or getattr(target.model, "weight_format", "float32")
        # and on a GPU it replays CUDA graphs when the target does
        graphs = getattr(target.model, "graphs", None) is not None
        draft = load_model(model, device=device, dtype=dtype, weights=weights, cuda_graphs=graphs)
        check_same_tokenizer(target, draft)
        draft = with_head_vocab(draft, draft_options.head_vocab)
        return DraftModelDrafter(draft, target.model.vocab_size, draft_options.min_confidence, name=f"draft:{arg}",
                                 prompt_window=draft_options.context)
    if kind == "quant":
        from specdec.drafters.self_draft import quantized_self_draft

        return quantized_self_draft(target, arg)
    if kind == "layerskip":
        from specdec.drafters.self_draft import layer_skip_draft

        return layer_skip_draft(target, arg)
    if kind in ("eagle", "medusa"):
        from specdec.drafters.heads import head_drafter

        return head_drafter(kind, arg, target)
    if kind == "lookahead":
        from specdec.drafters.lookahead import LookaheadDrafter

        try:
            window, ngram, pool = (int(v) for v in arg.split(",")) if arg else (4, 3, 4)
        except ValueError:
            raise InvalidParameterError(f"lookahead drafter: {arg!r} is not W,N,G (e.g. 4,3,4)") from None
        return LookaheadDrafter(window, ngram, pool)
    if kind == "retrieval" and arg:
        from specdec.datastore import Datastore
        from specdec.drafters.eagle import TreeShape, parse_tree_options
        from specdec.drafters.retrieval import RetrievalDrafter

        location, _, options = arg.partition("@")
        shape = parse_tree_options(options, TreeShape(depth=8, budget=16))
        store = Datastore.open(location, target.tokenizer)
        return RetrievalDrafter(store, f"retrieval:{location.rstrip('/').rsplit('/', 1)[-1]}", shape.budget, shape.depth)
    raise InvalidParameterError(f"unknown drafter {spec!r} (choose from: {DRAFTER_SPECS})")


__all__ = ["Draft", "DraftOptions", "Drafter", "VerifyResult", "make_drafter", "parse_draft_options", "DRAFTER_SPECS"]
