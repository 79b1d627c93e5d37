"""The drafter protocol: what the engine asks of every drafter.

A drafter proposes a `Draft` for the tokens after the committed context, is
told the `VerifyResult` so it can roll back its own state and adapt, and is
reset by `begin` for each new generation. The engine never knows which drafter
it runs.

Cache contract (invariant 2): after `on_verified`, whatever state a drafter
keeps (a KV cache, an index) describes committed tokens only. It may lag behind
the committed context; the next `propose` catches up first.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import Iterable, Sequence

import torch
from torch import nn

from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import SourceLengths


class Drafter(ABC):
    """Every drafter's interface. The required methods are abstract; each optional capability is declared
    here with the default that means "not used", so the engine calls methods and never probes a drafter.

    Capabilities (class attributes or properties a drafter overrides):
      feature_layers: the target's hidden layers this drafter reads (EAGLE, EAGLE-3, Medusa); () for none.
        The engine then asks the target for those layers in every forward (index i: the output of decoder
        layer i; num_layers: the final normed state) and hands the drafter, side by side, the rows of
        committed tokens through `take_features`: after prefill those of prompt[:-1], after each round those
        of the round's root and accepted drafts. So when `propose` runs, the drafter has had the feature of
        every context token but the last (which the target has not processed yet).
      tree_node_budget: for tree drafters, the number of nodes a round drafts; `k="auto"` uses it instead of
        the chain model of AdaptiveK. None for chain drafters.
      side_capacity: extra slots a verify forward needs for side inputs (`Draft.side`, lookahead).
      catch_up_seconds: of the last `propose`, the seconds spent catching up with the context rather than
        drafting (a draft model prefilling the prompt at its first proposal); the engine leaves them out of
        the per-token draft cost that `k="auto"` weighs.
      drafts_per_source: the drafter combines sources accepted at different rates; with `k="auto"` the engine
        hands it `SourceLengths` (`use_source_lengths`) and it drafts each source to that source's own K.
      reads_logits: after every round the engine hands the drafter each verify row's logits (as the
        acceptance rule read them: a grammar's mask applied) with the row's input token (`take_logits`):
        the target's candidates, recycled (drafters/recycle.py).
    """

    name: str
    feature_layers: tuple[int, ...] = ()
    tree_node_budget: int | None = None
    side_capacity: int = 0
    catch_up_seconds: float = 0.0
    drafts_per_source: bool = False
    reads_logits: bool = False

    @abstractmethod
    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        """Forget the previous generation and get ready for this prompt.

        max_length bounds prompt + committed + drafted tokens of this generation (size caches by it).
        """

    @abstractmethod
    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        """Up to max_tokens draft tokens that follow `context` (prompt + committed tokens). A drafter that
        samples draws its token at absolute position t (len(context) for the first) by inverse CDF
        (`sampling.inverse_cdf`) with `noise.uniform(t)`, so that a seed decides its drafts whatever K is, and
        under the match rule its draws are coupled with the target's (None: draw with a fresh seed)."""

    @abstractmethod
    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        """Roll own state back to committed tokens; `context` already includes result.tokens."""

    @abstractmethod
    def fresh(self) -> "Drafter":
        """A drafter with this one's settings and shared weights but its own per-generation state,
        for generations that run interleaved (the server)."""

    def proposal_source(self) -> str:
        """Which source made the last proposal (the stream's provenance names it): this drafter; a drafter
        that combines sources names the one it used."""
        return self.name

    def memory_bytes(self) -> int:
        """Bytes this drafter holds beyond the target: its own weights (not those it shares with the
        target), caches and indexes, at their current size. Reported as stats.drafter_memory_bytes."""
        return 0

    def use_source_lengths(self, lengths: SourceLengths) -> None:
        """For a drafter that declares drafts_per_source: from now on ask `lengths.next_k_for(source)` how many
        tokens a source drafts (at most the engine's max_tokens) and mark each draft with its source."""
        raise NotImplementedError(f"{type(self).__name__} does not declare drafts_per_source")

    def take_prompt_cache(self, target_cache) -> None:
        """Called after the target's prefill, before `begin`: a drafter that shares the target's layout
        (a self-draft) may take the prompt's keys and values from the target's cache instead of its own
        prefill. Default: nothing."""

    def take_logits(self, inputs: Sequence[int], logits: torch.Tensor) -> None:
        """logits (R, V): a round's verify rows, row r computed with inputs[r] as its last input token.
        Called only when reads_logits is set."""
        raise NotImplementedError(f"{type(self).__name__} declares reads_logits but does not take logits")

    def take_features(self, features: torch.Tensor) -> None:
        """features (n, C x layers): the target's hidden states at `feature_layers` of the next n committed
        tokens, in order. Called only when feature_layers is set."""
        raise NotImplementedError(f"{type(self).__name__} declares feature_layers but does not take features")


def tensor_bytes(tensors: Iterable[torch.Tensor | None], shared_with: nn.Module | None = None) -> int:
    """Bytes of distinct tensors (by storage), leaving out those that live in `shared_with`."""
    shared = set()
    if shared_with is not None:
        shared = {t.untyped_storage().data_ptr() for t in [*shared_with.parameters(), *shared_with.buffers()]}
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None and tensor.untyped_storage().data_ptr() not in shared:
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def module_bytes(module, shared_with: nn.Module | None = None) -> int:
    """Bytes of a module's own tensors (0 for what is not an nn.Module, e.g. a transformers adapter)."""
    if not isinstance(module, nn.Module):
        return 0
    return tensor_bytes([*module.parameters(), *module.buffers()], shared_with)


def container_bytes(value) -> int:
    """Bytes of a Python index (dicts, lists, tuples, sets of ints), as sys.getsizeof counts its objects."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(container_bytes(k) + container_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return size + sum(container_bytes(item) for item in value)
    return size
