"""The pieces of a target a head borrows: token embeddings, LM head rows, the feature it taps.

Heads predict the target's final normed hidden state (the LM head's input, `ForwardOutput.hidden_states
[num_layers]`), and score tokens with the target's own LM head restricted to a draft vocabulary: the
tokens the target actually predicts most often. Scoring 8k rows instead of 49k-152k makes a draft step
several times cheaper on a CPU, and costs nothing in exactness: the draft may propose any subset.
"""

from __future__ import annotations

import torch

from specdec.errors import InvalidParameterError
from specdec.kernels import packed_kernel
from specdec.models.quantized.packed_linear import PackedLinear


def native_model(model):
    """The native decoder behind a CausalLM, or a clear error (heads need its embeddings and LM head)."""
    if not hasattr(model, "model") or not hasattr(model.model, "embed_tokens") or not hasattr(model, "config"):
        raise InvalidParameterError("EAGLE and Medusa heads need the native backend (--backend native)")
    return model


def lm_head_rows(model, token_ids: torch.Tensor) -> torch.Tensor:
    """(N, C) rows of the target's LM head for token_ids (N,), in float32, whatever its storage."""
    head = model.lm_head
    if isinstance(head, PackedLinear):  # packed panels, int4/int7 codes, a GGUF file's blocks
        return head.embedding_rows(token_ids).float()
    return head.weight.detach()[token_ids].float()


def embed(model, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T) token ids -> (B, T, C) the target's input embeddings (constants: no gradient, usable in training)."""
    with torch.no_grad():
        return model.model.embed_tokens(tokens).float()


class DraftVocabulary:
    """The token ids a head scores, and the LM head rows that score them."""

    def __init__(self, model, token_ids: torch.Tensor, rows: torch.Tensor | None = None):
        """rows: the head's own LM-head rows for token_ids (a head trained elsewhere); None = the target's."""
        self.token_ids = token_ids.to(torch.int64)  # (N,) target ids, most frequent first
        if rows is None:
            rows = lm_head_rows(model, self.token_ids.to(model.device))
        self.rows = rows.float().to(model.device).contiguous()  # (N, C)
        # On the CPU the rows are also packed for the small-row kernel: ~2x faster than a stock matmul at
        # a draft step's few rows. In bfloat16: scoring is most of the bytes a draft step streams, and rounding
        # the rows moves a draft's scores, never what the target accepts.
        self.scorer = (PackedLinear(self.rows, None, [len(self.token_ids)]).quantize_("bf16")
                       if self.rows.device.type == "cpu" and packed_kernel() is not None else None)

    def tensors(self) -> list[torch.Tensor]:
        """What the vocabulary holds in memory (for drafters' memory figures)."""
        return [self.rows] + ([self.scorer.packed] if self.scorer is not None else [])

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., N) draft logits over the draft vocabulary."""
        if self.scorer is not None and hidden.dtype == torch.float32:
            return self.scorer(hidden)
        return hidden @ self.rows.T
