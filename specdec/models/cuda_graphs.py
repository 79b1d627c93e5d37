"""CUDA graphs for a native model's small forwards on a GPU: decode steps, verification, draft steps.

Why: on a GPU a decode step of these models is bound by the host, not the device: ~1,200 kernel launches
(norms, rope, casts and adds around the matmuls) at 6-8 us of host time each, while the GPU itself works
a fraction of a 1.5B model's step (measured on an H200). A captured graph launches
all of a forward's kernels at once.

A graph fixes shapes and addresses, so a graphed forward differs from the eager one in three ways:
- its KV cache lives on fixed storage: `new_cache` hands out caches over pooled storage (one storage per
  cache alive at a time, reused when its cache is gone), each storage with its own graphs; the last
  MAX_TOKENS slots of a storage are scratch for warm-up runs, never a cache's;
- new keys/values are written at slots held in a device tensor (`length + arange(T)`), not by slicing;
- attention reads every slot of the storage under a (1, T, S) mask that hides the empty ones, written
  before each replay (the caller's mask copied in, or the causal mask sliced from a template), with
  torch's math attention kernel (SlotWrites.attention_backends).
Should CUDA refuse a capture, the model warns once and runs its forwards eagerly from then on.
One graph per (T new tokens, hidden layers tapped, last logits only), captured on the second forward of
that kind, so one-off prefill lengths never are (the first runs the same static computation eagerly).
Outputs are copied out of the graph's buffers, which its next replay overwrites.

`capture=False` runs the same static computation eagerly: how the CPU tests check it (graphs need CUDA).
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.nn.attention import SDPBackend

from specdec.models.base import ForwardOutput
from specdec.models.kv_cache import KVCache

MAX_TOKENS = 32  # forwards over more new tokens (prefills) run eagerly
MIN_SLOTS = 1024  # storages are powers of two of at least this many slots: few sizes, so graphs get reused

GraphKey = tuple[int, tuple[int, ...], bool]  # (new tokens, hidden layers tapped, last logits only)


@dataclass
class SlotWrites:
    """The KV cache as a graphed forward sees it: new keys/values go to the slots a device tensor names,
    and attention reads the whole storage (its mask hides the empty slots)."""

    keys: torch.Tensor  # (L, 1, H_kv, S, D)
    values: torch.Tensor  # (L, 1, H_kv, S, D)
    slots: torch.Tensor  # (T,) int64
    # Attention under a graph: torch's math kernel, plain matmuls and a softmax that capture anywhere. The
    # memory-efficient kernel broke a float32 capture of 9 tree rows on an H200 (2026-11-30); over <= 32
    # new rows the math kernel costs a few microseconds of GPU time.
    attention_backends: tuple[SDPBackend, ...] = (SDPBackend.MATH,)

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer].index_copy_(2, self.slots, keys)  # keys (1, H_kv, T, D)
        self.values[layer].index_copy_(2, self.slots, values)
        return self.keys[layer], self.values[layer]  # (1, H_kv, S, D)


@dataclass
class _Graph:
    """One captured forward: its input buffers, its output buffers and the graph that links them."""

    tokens: torch.Tensor  # (1, T) int64
    positions: torch.Tensor  # (1, T) int64
    length: torch.Tensor  # () int64: the cache's length, where the T new slots start
    mask: torch.Tensor  # (1, T, S) bool
    graph: "torch.cuda.CUDAGraph | None" = None
    output: ForwardOutput | None = None


@dataclass
class _Storage:
    keys: torch.Tensor  # (L, 1, H_kv, S, D)
    values: torch.Tensor
    owner: weakref.ref | None = None  # the cache handed out over this storage
    graphs: dict[GraphKey, _Graph] = field(default_factory=dict)
    seen: set[GraphKey] = field(default_factory=set)  # kinds of forward run once (captured at the second)

    @property
    def slots(self) -> int:
        return self.keys.shape[3]

    def is_free(self) -> bool:
        return self.owner is None or self.owner() is None


class CudaGraphs:
    """The graphs and cache storage of one model (see the module docstring)."""

    def __init__(self, model, capture: bool | None = None):
        self.model = model  # a LlamaForCausalLM
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.storages: list[_Storage] = []
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None  # graphs share one memory pool
        self.offsets = torch.arange(MAX_TOKENS, device=model.device)  # (MAX_TOKENS,)
        self.causal: dict[int, torch.Tensor] = {}  # storage slots S -> (MAX_TOKENS, 2S) bool template
        self.replays = 0  # forwards served by a captured graph (tests and profiles read it)

    # -- caches ------------------------------------------------------------------------------
    def new_cache(self, max_length: int) -> KVCache:
        slots = max(MIN_SLOTS, 1 << (max_length + MAX_TOKENS - 1).bit_length())
        storage = next((s for s in self.storages if s.is_free() and s.slots == slots), None)
        if storage is None:
            # Free storage of other sizes goes first: memory follows the caches alive, not every size seen.
            self.storages = [s for s in self.storages if not s.is_free()]
            c = self.model.config
            shape = (c.num_layers, 1, c.num_kv_heads, slots, c.head_dim)
            keys = torch.zeros(shape, dtype=self.model.dtype, device=self.model.device)
            storage = _Storage(keys, torch.zeros_like(keys))
            self.storages.append(storage)
        cache = KVCache.over(storage.keys, storage.values, max_length)
        storage.owner = weakref.ref(cache)
        return cache

    def _storage_of(self, cache) -> _Storage | None:
        keys = getattr(cache, "keys", None)
        return next((s for s in self.storages if s.keys is keys), None)

    # -- forwards ----------------------------------------------------------------------------
    def serves(self, tokens: torch.Tensor, cache) -> bool:
        """Whether this forward runs the static (graphed) way: one sequence, few tokens, pooled cache."""
        return tokens.shape[0] == 1 and tokens.shape[1] <= MAX_TOKENS and self._storage_of(cache) is not None

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                attn_mask: torch.Tensor | None, hidden_layers: Sequence[int], last_logits_only: bool
                ) -> ForwardOutput:
        storage = self._storage_of(cache)
        num_new, length = tokens.shape[1], cache.length
        key: GraphKey = (num_new, tuple(sorted(set(hidden_layers))), last_logits_only)
        graph = storage.graphs.get(key)
        if graph is None:
            graph = self._buffers(storage, num_new)
        graph.tokens.copy_(tokens)
        graph.positions.copy_(positions)
        graph.length.fill_(length)
        if attn_mask is None:  # causal: slot s is visible to new row t when s <= length + t
            template = self._causal_template(storage.slots)
            graph.mask.copy_(template[:num_new, storage.slots - length: 2 * storage.slots - length])
        else:
            graph.mask.zero_()
            graph.mask[:, :, :length + num_new].copy_(attn_mask)  # (1, T, length + T)
        if key in storage.graphs:
            graph.graph.replay()
            self.replays += 1
            out = graph.output
        elif self.capture and key in storage.seen and self._capture(storage, key, graph):
            storage.graphs[key] = graph
            graph.graph.replay()
            self.replays += 1
            out = graph.output
        else:
            storage.seen.add(key)
            out = self._run(storage, key, graph)
        cache.advance(num_new)
        return ForwardOutput(out.logits.clone(), {i: h.clone() for i, h in out.hidden_states.items()})

    def _buffers(self, storage: _Storage, num_new: int) -> _Graph:
        device = self.model.device
        return _Graph(tokens=torch.zeros(1, num_new, dtype=torch.long, device=device),
                      positions=torch.zeros(1, num_new, dtype=torch.long, device=device),
                      length=torch.zeros((), dtype=torch.long, device=device),
                      mask=torch.zeros(1, num_new, storage.slots, dtype=torch.bool, device=device))

    def _run(self, storage: _Storage, key: GraphKey, graph: _Graph) -> ForwardOutput:
        """The static forward: the same kernels eagerly, or recorded while capturing."""
        num_new, hidden_layers, last_logits_only = key
        slots = graph.length + self.offsets[:num_new]  # (T,)
        return self.model.run(graph.tokens, graph.positions, SlotWrites(storage.keys, storage.values, slots),
                              graph.mask, None, hidden_layers, last_logits_only)

    def _capture(self, storage: _Storage, key: GraphKey, graph: _Graph) -> bool:
        """Record this forward into graph.graph; False (and eager forwards from then on) if CUDA refused."""
        # The buffers hold this forward's inputs; a warm-up run (cuBLAS and the allocator want one before a
        # capture) must not write over the cache, so it points at the scratch slots at the storage's end.
        length = graph.length.clone()
        graph.length.fill_(storage.slots - MAX_TOKENS)
        side = torch.cuda.Stream(device=self.model.device)
        side.wait_stream(torch.cuda.current_stream())
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            self._run(storage, key, graph)
            captured.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                graph.output = self._run(storage, key, graph)
                captured.capture_end()
            except Exception as error:  # noqa: BLE001 - whatever CUDA refused, the eager forward still works
                self._abandon(captured, error)
        torch.cuda.current_stream().wait_stream(side)
        graph.length.copy_(length)
        if not self.capture:
            return False
        graph.graph = captured
        return True

    def _abandon(self, captured: "torch.cuda.CUDAGraph", error: Exception) -> None:
        """After a failed capture: end it and the allocator's recording into the pool, and stop capturing
        for this model (later captures into that pool would fail: "already recording")."""
        if torch.cuda.is_current_stream_capturing():
            try:
                captured.capture_end()
            except Exception:  # noqa: BLE001 - an invalidated capture reports its error again here
                pass
        try:  # capture_end raised before ending the allocator's recording into the pool (the graph's
            # destructor releases the pool itself)
            torch._C._cuda_endAllocateToPool(self.model.device.index or 0, self.pool)
        except Exception:  # noqa: BLE001 - torch internals; the pool then just stays reserved
            pass
        self.capture = False
        warnings.warn(f"CUDA graph capture failed, this model runs eagerly from now on: "
                      f"{str(error).splitlines()[0]}", RuntimeWarning, stacklevel=3)

    def _causal_template(self, slots: int) -> torch.Tensor:
        """(MAX_TOKENS, 2S) bool, row t true at columns j <= t + S: its columns [S - length, 2S - length)
        are row t's causal mask over the storage at a given cache length."""
        if slots not in self.causal:
            columns = torch.arange(2 * slots, device=self.model.device)
            self.causal[slots] = columns[None, :] <= self.offsets[:, None] + slots
        return self.causal[slots]
