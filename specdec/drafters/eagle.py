"""EAGLE-2 drafting: a trained one-layer head drafts a dynamic tree from the target's own features.

The same tree search drafts with an EAGLE head (the target's final feature in, a predicted feature out)
and an EAGLE-3 head (several target layers fused in, its own state fed back): the head says which target
layers it reads (`feature_layers`), how it fuses them (`fuse`) and what its LM head scores (`scoring_input`).

Each round the head first catches up on the committed tokens, fed with the target's true features
(take_features), then grows a tree (Li et al. 2024, EAGLE-2): from the predicted feature of the last
committed token it takes the top-k next tokens; at each further depth it expands the k nodes with
the highest cumulative draft log-probability (one head forward for all k), each proposing its top-k
children; finally the `budget` best nodes of everything proposed become the draft (a child never scores
above its parent, so the best nodes form a tree). Children are the draft's top tokens, proposed
deterministically: exact under greedy and sampling alike (tree verification, one-hot draft laws).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.drafters.base import Drafter, module_bytes, tensor_bytes
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.errors import InvalidParameterError
from specdec.heads.checkpoint import LoadedHead
from specdec.heads.target_parts import DraftVocabulary, embed
from specdec.core.sampling import SamplingParams


@dataclass(frozen=True)
class TreeShape:
    depth: int = 5  # tree depth: at most this many tokens accepted per round (plus the bonus)
    top_k: int = 8  # children per expanded node, and nodes expanded per depth
    budget: int = 24  # nodes verified per round (the engine's K for tree drafters)

    def __post_init__(self):
        if not (1 <= self.depth <= 16 and 1 <= self.top_k <= 32 and 1 <= self.budget <= 256):
            raise InvalidParameterError("tree shape: need 1 <= depth <= 16, 1 <= topk <= 32, 1 <= budget <= 256")


def tree_with(defaults: TreeShape, depth: int | None = None, top_k: int | None = None,
              budget: int | None = None) -> TreeShape:
    """`defaults` with the values a spec gave (None: not given), range-checked."""
    given = {"depth": depth, "top_k": top_k, "budget": budget}
    return dataclasses.replace(defaults, **{key: value for key, value in given.items() if value is not None})


@dataclass(frozen=True)
class TreeOptions:
    """eagle[:HEAD_DIR]@depth=D,topk=W,budget=N (any of them; the target's device picks the rest)."""

    depth: int | None = None
    topk: int | None = None
    budget: int | None = None

    def __post_init__(self):
        self.shape(TreeShape())  # the ranges, checked before anything loads

    def shape(self, defaults: TreeShape) -> TreeShape:
        return tree_with(defaults, self.depth, self.topk, self.budget)


class EagleDrafter(Drafter):
    def __init__(self, head: LoadedHead, target_model, shape: TreeShape, name: str,
                 vocab: DraftVocabulary | None = None, module=None):
        self.name = name
        self.loaded, self.target_model, self.shape = head, target_model, shape
        self.head = module or head.module.packed_copy()  # the module drafting runs (packed on the CPU kernel)
        self.vocab = vocab or DraftVocabulary(target_model, head.draft_vocab, head.lm_rows)
        self.feature_layers = head.feature_layers(target_model)
        self.tree_node_budget = shape.budget
        self.cache = None
        self.pending: list[torch.Tensor] = []

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(1, T) token ids -> (1, T, C) the head's token embeddings (the target's, unless it brought its own)."""
        if self.loaded.embeddings is not None:
            return self.loaded.embeddings[tokens].float()
        return embed(self.target_model, tokens)

    def fresh(self) -> "EagleDrafter":
        return EagleDrafter(self.loaded, self.target_model, self.shape, self.name, self.vocab, self.head)  # shared

    def memory_bytes(self) -> int:
        """The head's weights, the draft vocabulary's LM-head rows and the head's KV cache."""
        cache = self.cache.nbytes if self.cache is not None else 0
        return module_bytes(self.head, self.target_model) + tensor_bytes(self.vocab.tensors(), self.target_model) + cache

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        # committed pairs (< max_length) + the tree's fed nodes (top_k per expanded depth)
        self.cache = self.head.new_cache(max_length + self.shape.depth * self.shape.top_k)
        self.pending = []

    def take_features(self, features: torch.Tensor) -> None:
        self.pending.append(features)

    @torch.inference_mode()
    def _catch_up(self, context: Sequence[int]) -> torch.Tensor | None:
        """Feed the committed pairs (f_j, token j+1) the head has not seen; the head's output at the
        last context token (1, C), or None when there is no pair yet (a one-token prompt)."""
        start = self.cache.length
        features = torch.cat(self.pending) if self.pending else None  # (m, C)
        self.pending = []
        if features is None or features.shape[0] == 0:
            return None
        stop = start + features.shape[0]
        assert stop == len(context) - 1, "features must cover every context token but the last"
        device = features.device
        tokens = torch.tensor([context[start + 1: stop + 1]], device=device)  # (1, m)
        positions = torch.arange(start, stop, device=device).unsqueeze(0)  # (1, m)
        predicted = self.head(self.embed(tokens), self.head.fuse(features.unsqueeze(0).float()), positions,
                              self.cache, None)  # (1, m, C)
        return predicted[0, -1:]

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        last = self._catch_up(context)
        if last is None:
            return Draft.empty()
        base = self.cache.length  # committed pairs: len(context) - 1
        try:
            return self._grow_tree(last, base, max_tokens)
        finally:
            self.cache.truncate(base)  # forget the drafted nodes; the true features come next round

    def _grow_tree(self, last: torch.Tensor, base: int, budget: int) -> Draft:
        k, device, vocab = self.shape.top_k, last.device, self.vocab
        logp = torch.log_softmax(vocab.logits(self.head.scoring_input(last)), dim=-1)  # (1, N)
        scores, index = logp[0].topk(min(k, len(vocab)))
        # Every proposed node: draft-vocabulary index, parent node (-1 = root), cumulative log-prob, depth.
        tokens: list[int] = index.tolist()
        parents: list[int] = [-1] * len(tokens)
        cumulative: list[float] = scores.tolist()
        depths: list[int] = [1] * len(tokens)
        slot: dict[int, int] = {}  # node -> its cache slot once fed
        hidden_of: dict[int, torch.Tensor] = {}
        frontier = list(range(len(tokens)))
        parent_hidden = last.expand(len(frontier), -1)  # (F, C)
        max_depth = min(self.shape.depth, budget)
        for depth in range(1, max_depth):
            # Feed the frontier (depth `depth`): pair (parent's predicted feature, node's token).
            count = len(frontier)
            node_tokens = vocab.token_ids[[tokens[n] for n in frontier]].to(device).unsqueeze(0)  # (1, F)
            positions = torch.full((1, count), base - 1 + depth, device=device)
            mask = torch.zeros(count, self.cache.length + count, dtype=torch.bool, device=device)
            mask[:, :base] = True
            for row, node in enumerate(frontier):
                ancestor = parents[node]
                while ancestor != -1:
                    mask[row, slot[ancestor]] = True
                    ancestor = parents[ancestor]
                slot[node] = self.cache.length + row
                mask[row, slot[node]] = True
            hidden = self.head(self.embed(node_tokens), parent_hidden.unsqueeze(0), positions,
                               self.cache, mask.unsqueeze(0))[0]  # (F, C)
            child_logp = torch.log_softmax(vocab.logits(self.head.scoring_input(hidden)), dim=-1)  # (F, N)
            top_logp, top_index = child_logp.topk(min(k, len(vocab)), dim=-1)  # (F, k)
            total = top_logp + torch.tensor([cumulative[n] for n in frontier], device=device).unsqueeze(1)
            first_child = len(tokens)
            for row, node in enumerate(frontier):
                hidden_of[node] = hidden[row]
                tokens += top_index[row].tolist()
                cumulative += total[row].tolist()
                parents += [node] * top_index.shape[1]
                depths += [depth + 1] * top_index.shape[1]
            # Expand the k best children next (EAGLE-2: by cumulative draft probability).
            best = total.flatten().topk(min(k, total.numel())).indices.tolist()
            frontier = [first_child + i for i in best]
            parent_hidden = torch.stack([hidden_of[parents[n]] for n in frontier])
        return self._select(tokens, parents, cumulative, depths, budget)

    def _select(self, tokens, parents, cumulative, depths, budget) -> Draft:
        """The `budget` most probable nodes (ancestors always included), parents before children."""
        order = sorted(range(len(tokens)), key=lambda n: (-cumulative[n], depths[n]))
        chosen: set[int] = set()
        for node in order:
            if len(chosen) == budget:
                break
            if parents[node] == -1 or parents[node] in chosen:
                chosen.add(node)
        kept = sorted(chosen, key=lambda n: (depths[n], -cumulative[n]))
        new_index = {node: i for i, node in enumerate(kept)}
        ids = self.vocab.token_ids[[tokens[n] for n in kept]].tolist()
        return Draft(ids, [new_index[parents[n]] if parents[n] != -1 else -1 for n in kept])

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        pass  # the cache was cut back to committed pairs in propose; true features arrive via take_features
