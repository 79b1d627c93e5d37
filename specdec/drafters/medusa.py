"""Medusa drafting: H heads on the last verified feature propose a static tree of top-k choices.

Head k, applied to the feature that produced the last committed token, scores the token k places
after it. The tree is fixed per budget: the `budget` paths of ranks (i_1, ..., i_d) with the highest
estimated probability prod_k accuracy[k][i_k], where accuracy[k][i] is head k's measured top-(i+1)
hit rate from training (head.json) - Medusa's calibrated "choices", grown best-first. Children are the
heads' top tokens, proposed deterministically, so verification is exact for greedy and sampling.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from typing import Sequence

import torch

from specdec.drafters.base import Drafter, module_bytes, tensor_bytes
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.heads.checkpoint import LoadedHead
from specdec.heads.target_parts import DraftVocabulary
from specdec.core.sampling import SamplingParams

MAX_RANK = 10  # children per node are ranks 0..MAX_RANK-1 of a head's scores


def default_accuracy(num_heads: int) -> list[list[float]]:
    """Per-head rank hit rates when the checkpoint has none: decaying with depth and with rank."""
    return [[0.6 * 0.75 ** head * 0.55 ** rank for rank in range(MAX_RANK)] for head in range(num_heads)]


@lru_cache(maxsize=64)
def static_tree(accuracy: tuple[tuple[float, ...], ...], budget: int) -> tuple[tuple[int, ...], ...]:
    """The `budget` most probable rank paths, best first; a path's parent always comes before it."""
    paths: list[tuple[int, ...]] = []
    heap = [(-accuracy[0][0], (0,))]
    while heap and len(paths) < budget:
        negative, path = heapq.heappop(heap)
        paths.append(path)
        probability = -negative
        depth = len(path)
        if path[-1] + 1 < len(accuracy[depth - 1]):  # next sibling: one rank lower at this depth
            sibling = path[:-1] + (path[-1] + 1,)
            parent_probability = probability / accuracy[depth - 1][path[-1]]
            heapq.heappush(heap, (-parent_probability * accuracy[depth - 1][path[-1] + 1], sibling))
        if depth < len(accuracy):  # first child: rank 0 of the next head
            heapq.heappush(heap, (-probability * accuracy[depth][0], path + (0,)))
    return tuple(paths)


class MedusaDrafter(Drafter):
    def __init__(self, head: LoadedHead, target_model, budget: int, name: str, vocab: DraftVocabulary | None = None):
        self.name = name
        self.loaded, self.heads, self.target_model = head, head.module, target_model
        self.vocab = vocab or DraftVocabulary(target_model, head.draft_vocab)
        self.feature_layers = (target_model.num_layers,)
        self.tree_node_budget = budget
        num_heads = head.module.shape.num_heads
        measured = head.info.validation.get("rank_accuracy")
        accuracy = measured if measured else default_accuracy(num_heads)
        # Ranks that never hit would still be a (useless) node; keep each rate above zero for the ordering.
        self.accuracy = tuple(tuple(max(a, 1e-6) for a in row[:MAX_RANK]) for row in accuracy[:num_heads])
        self.last_feature: torch.Tensor | None = None

    def fresh(self) -> "MedusaDrafter":
        return MedusaDrafter(self.loaded, self.target_model, self.tree_node_budget, self.name, self.vocab)

    def memory_bytes(self) -> int:
        """The heads' weights and the draft vocabulary's LM-head rows."""
        return module_bytes(self.heads, self.target_model) + tensor_bytes(self.vocab.tensors(), self.target_model)

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        self.last_feature = None

    def take_features(self, features: torch.Tensor) -> None:
        if features.shape[0]:
            self.last_feature = features[-1]  # (C,) the feature that produced the last committed token

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        if self.last_feature is None:
            return Draft.empty()
        paths = static_tree(self.accuracy, max_tokens)
        scores = self.vocab.logits(self.heads(self.last_feature.float()))  # (H, N)
        ranks = scores.topk(min(MAX_RANK, scores.shape[-1]), dim=-1).indices  # (H, R)
        choices = self.vocab.token_ids[ranks.cpu()].tolist()  # (H, R) target token ids (the table is on the CPU)
        node_of: dict[tuple[int, ...], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        for path in paths:  # parents come first in `paths`
            node_of[path] = len(tokens)
            tokens.append(choices[len(path) - 1][path[-1]])
            parents.append(node_of[path[:-1]] if len(path) > 1 else -1)
        return Draft(tokens, parents)

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        pass
