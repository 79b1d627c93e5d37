"""Token trees: drafted tokens with parent pointers, verified in one target forward.

Node i holds tokens[i]; parents[i] is another node's index (always smaller: parents come first) or -1
for the root, the last committed token, which is not a node. From the parents follow everything
verification needs: the attention mask (each node sees its ancestors and itself), each node's depth
(its position is the root's position + depth), the children of a node in proposal order, and the
root-to-leaf paths. A chain is the tree whose parents are -1, 0, 1, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch

ROOT = -1


@dataclass(frozen=True)
class TokenTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        for node, parent in enumerate(self.parents):
            if not ROOT <= parent < node:
                raise ValueError(f"node {node}: parent {parent} must be -1 or an earlier node")

    @classmethod
    def from_draft(cls, tokens: Sequence[int], parents: Sequence[int]) -> "TokenTree":
        return cls(tuple(tokens), tuple(parents))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> "TokenTree":
        """Merge token paths from the root into a tree (shared prefixes become shared nodes), keeping
        the order in which each node first appears. Medusa's static "choices" are such paths."""
        tokens: list[int] = []
        parents: list[int] = []
        node_of: dict[tuple[int, ...], int] = {}
        for path in paths:
            parent = ROOT
            for depth in range(len(path)):
                prefix = tuple(path[: depth + 1])
                if prefix not in node_of:
                    node_of[prefix] = len(tokens)
                    tokens.append(path[depth])
                    parents.append(parent)
                parent = node_of[prefix]
        return cls(tuple(tokens), tuple(parents))

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """1 for the root's children, then one more per generation."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return tuple(depths)

    @cached_property
    def children(self) -> dict[int, tuple[int, ...]]:
        """node (or ROOT) -> its children in proposal order."""
        table: dict[int, list[int]] = {ROOT: []}
        for node, parent in enumerate(self.parents):
            table.setdefault(node, [])
            table[parent].append(node)
        return {node: tuple(kids) for node, kids in table.items()}

    def ancestors(self, node: int) -> list[int]:
        """The node's ancestors from the root's child down, then the node itself."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Node indices of every root-to-leaf path, leaves in node order."""
        return [self.ancestors(node) for node in range(len(self)) if not self.children[node]]

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(T, T) bool: [i, j] is True when node j is node i or one of its ancestors."""
        mask = torch.zeros(len(self), len(self), dtype=torch.bool)
        for node in range(len(self)):
            mask[node, self.ancestors(node)] = True
        return mask.to(device)

    def verify_inputs(self, root_token: int, root_position: int, device: torch.device | str = "cpu"
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target inputs for root + nodes: tokens (1, T+1), positions (1, T+1) and the (T+1, T+1)
        ancestor-or-self mask, the root seen by everyone; combine with the cache via tree_attention_mask."""
        tokens = torch.tensor([[root_token, *self.tokens]], device=device)
        positions = torch.tensor([[root_position, *(root_position + d for d in self.depths)]], device=device)
        mask = torch.zeros(len(self) + 1, len(self) + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[1:, 1:] = self.ancestor_mask()
        return tokens, positions, mask.to(device)
