"""Native Llama-family decoder: Llama 2/3/3.2, SmolLM/SmolLM2, Qwen2/2.5, Qwen3 (dense and MoE), Mistral, Gemma 3,
Phi-3/4-mini, gpt-oss.

GQA, RoPE (with Llama-3 scaling), RMSNorm, SwiGLU; Qwen3's per-head query/key norms; Gemma 3's (1 + w) norms
around attention and feed-forward, GELU, scaled embeddings and sliding-window layers with their own rope
base (the cache keeps every key; a sliding layer's attention masks those outside the window, exactly as
transformers does, so truncation and tree compaction stay as they are). Parameter names mirror the
Hugging Face checkpoints (`model.layers.0.self_attn.q_proj.weight`, ...), so a
safetensors state dict loads as it is.

One forward serves prefill, single-token decode and tree verification: the
caller gives positions and, for trees, an attention mask over cached prefix +
new tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from specdec.kernels import FLOAT_PANEL_DTYPES
from specdec.models.attention import (
    PREFILL_BLOCK,
    PREFILL_ROW_LIMIT,
    ROW_BY_ROW_MAX,
    CausalBlock,
    RowAttention,
)
from specdec.models.base import (
    CausalLM,
    ForwardOutput,
    ForwardRequest,
    causal_attention_mask,
    forward_each,
    sliding_window_mask,
)
from specdec.models.config import ModelConfig
from specdec.models.decoder_layer import DecoderStack
from specdec.models.cuda_graphs import CudaGraphs
from specdec.models.feed_forward import MixtureOfExperts
from specdec.models.grouped_attention import GroupedMask
from specdec.models.kv_cache import KVCache
from specdec.models.layer_plan import LayerPlan, layer_plan, plan_applies
from specdec.models.quantized.packed_linear import PackedEmbedding, PackedLinear, head_weight_format
from specdec.models.rope import rope_cos_sin, rope_inverse_frequencies


EMBEDDING_TABLE = "model.embed_tokens.table"  # untied embeddings kept packed (PackedEmbedding owned=True)


class LlamaForCausalLM(nn.Module, CausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config.rope, config.head_dim), persistent=False)
        self.register_buffer("local_inv_freq", rope_inverse_frequencies(config.local_rope or config.rope,
                                                                        config.head_dim), persistent=False)
        self.graphs: CudaGraphs | None = None  # set by use_cuda_graphs()
        # The KV cache's element type (None: the model's dtype). A two-byte cache halves the bytes a pass deep in
        # a context reads; keys and values are rounded once as they are written, so plain and speculative
        # decoding read the same stored values.
        self.kv_dtype: torch.dtype | None = None

    def init_rope(self, device: torch.device | str) -> None:
        """Recompute the rope tables on `device` (after a load on the meta device): the global one and the
        sliding layers' own (Gemma 3's local base)."""
        c = self.config
        self.inv_freq = rope_inverse_frequencies(c.rope, c.head_dim).to(device)
        self.local_inv_freq = rope_inverse_frequencies(c.local_rope or c.rope, c.head_dim).to(device)

    def use_cuda_graphs(self) -> None:
        """Replay decode and verification forwards as CUDA graphs (models on a GPU; see cuda_graphs.py). Not
        for sliding-window models: a graph's attention reads its whole storage under a mask that would have
        to follow the window too; nor for mixtures of experts, whose expert choice the host reads per pass."""
        if self.config.sliding_window is None and not self.config.moe_layers:  # routing is decided on the host
            self.graphs = CudaGraphs(self)

    def pack_weights(self, weights: str = "float32", cached: dict[str, nn.Module] | None = None,
                     embedding_table: nn.Module | None = None) -> None:
        """Switch every float32 linear layer to the CPU small-row kernel (specdec.kernels).

        Fuses q/k/v and gate/up, packs each matrix once, and frees the original
        layout; tied embeddings are then read from the packed LM head.
        weights="int8" or "int4[:G]" then quantizes each packed matrix, layer by
        layer so the float32 copies are freed as it goes (an int4 model keeps a
        7-bit LM head: packed_linear.head_weight_format).
        `cached` (packed layer name -> PackedLinear, from models/quantized/packed_cache.py) installs layers packed
        earlier instead: the float weights are then not needed at all. `embedding_table` (a PackedLinear over
        the same values as the untied embeddings, e.g. a GGUF file's blocks) replaces the float32 table: a
        lookup reads one row a token, and the table is the largest matrix of a small model.
        """
        def packed(name: str, linears, weights=weights):
            if cached is not None:
                return cached[name]
            return PackedLinear.fuse(linears).quantize_(weights)

        for index, layer in enumerate(self.model.layers):
            layer.pack_projections(packed, f"model.layers.{index}")
        self.lm_head = packed("lm_head", [self.lm_head], head_weight_format(weights))
        if self.config.tie_word_embeddings:
            self.model.embed_tokens = PackedEmbedding(self.lm_head)
        elif cached is not None and EMBEDDING_TABLE in cached:  # a GGUF file's quantized embeddings
            self.model.embed_tokens = PackedEmbedding(cached[EMBEDDING_TABLE], owned=True)
        elif embedding_table is not None:
            self.model.embed_tokens = PackedEmbedding(embedding_table, owned=True)
        elif cached is None and weights in FLOAT_PANEL_DTYPES and weights != "float32":  # untied: in two bytes too
            table = PackedLinear(self.model.embed_tokens.weight.detach(), None, [self.config.vocab_size])
            self.model.embed_tokens = PackedEmbedding(table.quantize_(weights), owned=True)

    def layers_are_packed(self) -> bool:
        """Whether pack_weights() ran: the layers' matrices are then PackedLinear (the CPU kernels)."""
        return getattr(self.model.layers[0].self_attn, "qkv_proj", None) is not None if len(self.model.layers) else False

    @property
    def weight_format(self) -> str:
        """The format the layers' matrices are stored in (the LM head may differ: head_weight_format)."""
        matrix = self.model.layers[0].self_attn.o_proj if len(self.model.layers) else self.lm_head
        return getattr(matrix, "weight_format", "float32")

    # -- the CausalLM interface (specdec.models.base) --------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> KVCache:
        if self.graphs is not None and batch_size == 1 and max_length is not None:
            return self.graphs.new_cache(max_length)  # over storage its graphs are captured on
        c = self.config
        return KVCache(
            c.num_layers, batch_size, c.num_kv_heads, max_length or c.max_position_embeddings,
            c.head_dim, self.kv_dtype or self.dtype, self.device,
        )

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # (B, T)
        positions: torch.Tensor,  # (B, T)
        cache: KVCache,
        attn_mask: torch.Tensor | None = None,  # (B or 1, T, cache.length + T) bool
        hidden_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> ForwardOutput:
        num_new = tokens.shape[1]
        cache.check_room(num_new)
        if self.graphs is not None and self.graphs.serves(tokens, cache):
            return self.graphs.forward(tokens, positions, cache, attn_mask, hidden_layers, last_logits_only)
        if attn_mask is None and num_new > ROW_BY_ROW_MAX and tokens.shape[0] == 1 and self.prefill_is_chunk_invariant:
            return self._prefill_in_pieces(tokens, positions, cache, hidden_layers, last_logits_only)
        # A first prefill keeps attn_mask None: attention then runs torch's causal kernel, which skips the
        # masked half of the scores (a 1k-token prompt's attention 1.4 -> 1.0 s on the 135M model)
        causal_prefill = attn_mask is None and cache.length == 0 and num_new > ROW_BY_ROW_MAX
        if attn_mask is None and num_new > 1 and not causal_prefill:
            attn_mask = causal_attention_mask(cache.length, num_new, tokens.device)
        rows = None
        # Only on the CPU, where the matmul kernels are row-invariant too: on a GPU the batched
        # matmuls round per row count anyway, and T attention calls per layer would cost T launches.
        if num_new <= ROW_BY_ROW_MAX and tokens.shape[0] == 1 and tokens.device.type == "cpu":
            rows = RowAttention.for_forward(attn_mask, cache.length, num_new)
        out = self.run(tokens, positions, cache, attn_mask, rows, hidden_layers, last_logits_only)
        cache.advance(num_new)
        return out

    @property
    def prefill_is_chunk_invariant(self) -> bool:
        """Whether a prompt's keys and values do not depend on how its prefill is split (PREFILL_ROW_LIMIT):
        the CPU kernels compute a row the same at any row count (not int8 panels, dequantized for long
        prefills; not torch's matmuls on a GPU), and no sliding window (its layers attend per window)."""
        return (self.device.type == "cpu" and RowAttention.uses_kernel(self.model.norm.weight) and self.graphs is None
                and self.layers_are_packed() and self.weight_format != "int8" and not self.config.sliding_window)

    def reusable_prefix(self, length: int, prefilled: int | None = None) -> int:
        """The longest prefix of a cache's `length` slots that a prefill can stop at and go on from (a cached
        prefix, a chunk boundary) with the same keys and values as one prefill; 0 where none can. `prefilled`:
        how many of the slots a prefill computed (None: all); the others came from decoding steps, which
        attend row by row, as a prefill does only below PREFILL_ROW_LIMIT."""
        if not self.prefill_is_chunk_invariant:
            return 0
        if prefilled is not None and length > prefilled:
            length = max(prefilled, min(length, PREFILL_ROW_LIMIT))
        if length <= PREFILL_ROW_LIMIT:
            return length
        return PREFILL_ROW_LIMIT + (length - PREFILL_ROW_LIMIT) // PREFILL_BLOCK * PREFILL_BLOCK

    def prompt_row_cost(self, depth: int) -> float:
        return 1.0 + depth / self.config.attention_depth

    def _prefill_in_pieces(self, tokens, positions, cache: KVCache, hidden_layers: Sequence[int],
                           last_logits_only: bool) -> ForwardOutput:
        """A causal forward of many rows as the pieces PREFILL_ROW_LIMIT and PREFILL_BLOCK fix: rows below the
        limit, and any piece of at most ROW_BY_ROW_MAX rows, attend row by row; later blocks of PREFILL_BLOCK
        rows, aligned to the limit, each in one attention call over the cache."""
        num_new, done, outs = tokens.shape[1], 0, []
        while done < num_new:
            position = cache.length
            end = self.reusable_prefix(position + PREFILL_BLOCK) if position >= PREFILL_ROW_LIMIT else PREFILL_ROW_LIMIT
            count = min(end - position, num_new - done)
            piece = slice(done, done + count)
            if position < PREFILL_ROW_LIMIT or count <= ROW_BY_ROW_MAX:
                mask, rows = None, RowAttention.for_forward(None, position, count)
            elif CausalBlock.applies(self.model.norm.weight, self.config.head_dim):
                mask, rows = None, CausalBlock(position)
            else:
                mask, rows = causal_attention_mask(position, count, tokens.device), None
            outs.append(self.run(tokens[:, piece], positions[:, piece], cache, mask, rows, hidden_layers,
                                 last_logits_only))
            cache.advance(count)
            done += count
        if len(outs) == 1:
            return outs[0]
        logits = outs[-1].logits if last_logits_only else torch.cat([out.logits for out in outs], dim=1)
        hidden = {layer: torch.cat([out.hidden_states[layer] for out in outs], dim=1) for layer in outs[0].hidden_states}
        return ForwardOutput(logits, hidden)

    @torch.inference_mode()
    def forward_batch(self, requests: Sequence[ForwardRequest], hidden_layers: Sequence[int] = ()) -> list[ForwardOutput]:
        """Several requests' forwards (each its own cache, positions and mask: a ragged batch) in one pass over
        the weights, where the CPU kernels run them (packed float32 or quantized layers, a few rows each);
        else one after another. Either way each request's outputs are bit-identical to its own forward: the
        weights' kernels compute a row the same at any row count, and attention stays per request."""
        batch = self._batch_plan(requests)
        if batch is None:
            return forward_each(self, requests, hidden_layers)
        plan, parts = batch
        c = self.config
        x = self.model.embed_tokens(torch.cat([r.tokens for r in requests], dim=1))  # (1, R, C)
        cos, sin = rope_cos_sin(self.inv_freq, torch.cat([r.positions for r in requests], dim=1), self.dtype,
                                c.rope.attention_factor)
        wanted, hidden, start = set(hidden_layers), {}, 0
        for stop in sorted({index + 1 for index in wanted if 0 <= index < c.num_layers} | {c.num_layers}):
            x = plan.run_batch(x, cos, sin, parts, start, stop, c.num_heads, c.num_kv_heads, c.head_dim)
            if stop - 1 in wanted:
                hidden[stop - 1] = x
            start = stop
        x = self.model.norm(x)
        if c.num_layers in wanted:
            hidden[c.num_layers] = x
        logits = self.lm_head(x).float()  # (1, R, V)
        outputs, row = [], 0
        for request, (cache, _, count) in zip(requests, parts):
            rows = slice(row, row + count)
            outputs.append(ForwardOutput(logits[:, rows], {layer: state[:, rows] for layer, state in hidden.items()}))
            cache.advance(count)
            row += count
        return outputs

    def _batch_plan(self, requests: Sequence[ForwardRequest]) -> tuple[LayerPlan, list] | None:
        """(the layer plan, [(cache, RowAttention, rows) per request]) where one pass can run `requests`."""
        c = self.config
        if len(requests) < 2 or self.graphs is not None or c.sliding_window or not c.runs_layer_plan:
            return None
        if c.final_logit_softcap is not None or c.embedding_scale is not None:
            return None
        probe = torch.empty(1, 1, c.hidden_size, dtype=self.dtype, device=self.device)
        parts = []
        for request in requests:
            count = request.tokens.shape[1]
            if request.tokens.shape[0] != 1 or not 1 <= count <= ROW_BY_ROW_MAX:
                return None
            request.cache.check_room(count)
            rows = RowAttention.for_forward(request.attn_mask, request.cache.length, count)
            if not plan_applies(probe, request.cache, rows):
                return None
            parts.append((request.cache, rows, count))
        plan = self.layer_plan(probe, parts[0][0], parts[0][1]) if self.layers_are_packed() else None
        return None if plan is None else (plan, parts)

    def layer_plan(self, x: torch.Tensor, cache, rows: RowAttention | None) -> LayerPlan | None:
        """The one-call path through the layers (models/layer_plan.py) where it applies, else None."""
        # the one C call has no step for Gemma's layers: those run layer by layer (each
        # matmul still packed)
        if not self.layers_are_packed() or not self.config.runs_layer_plan:
            return None
        return layer_plan(self, self.model.layers, x, cache, rows, self.config.sliding_layers)

    def run(
        self,
        tokens: torch.Tensor,  # (B, T)
        positions: torch.Tensor,  # (B, T)
        cache,  # a KVCache, or the slot writer of a CUDA graph (cuda_graphs.SlotWrites): anything with write()
        attn_mask: torch.Tensor | None,  # (B or 1, T, S) bool over the keys cache.write returns
        rows: RowAttention | None,
        hidden_layers: Sequence[int],
        last_logits_only: bool,
    ) -> ForwardOutput:
        """The layers themselves: embeddings -> decoder layers (writing the cache) -> norm -> LM head.
        Leaves the cache's length to the caller."""
        c = self.config
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.dtype, c.rope.attention_factor)
        local = (cos, sin, attn_mask, rows)  # what the sliding-window layers attend with
        if c.local_rope is not None:
            local = (*rope_cos_sin(self.local_inv_freq, positions, self.dtype), attn_mask, rows)
        window = self.window_inputs(positions, cache.length, attn_mask, rows) if c.sliding_window else None
        if window is not None:
            local = (local[0], local[1], *window)
        sliding = set(c.sliding_layers)
        wanted = set(hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        x = self.model.embed_tokens(tokens)  # (B, T, C)
        if c.embedding_scale is not None:  # as a tensor of x's dtype, as transformers multiplies
            x = x * torch.tensor(c.embedding_scale, dtype=x.dtype)
        # past a window's edge the plan's sliding layers take each row's first slot (local[3].first_key), where
        # they share the global rope (Gemma 3's local base runs layer by layer)
        windowed_rows = window is not None and local[3] is not None and c.local_rope is None
        plan_rows = local[3] if windowed_rows else rows
        plan = self.layer_plan(x, cache, plan_rows) if window is None or windowed_rows else None
        if plan is not None:  # the CPU kernels: every layer in one C call (models/layer_plan.py)
            start = 0
            for stop in sorted({index + 1 for index in wanted if 0 <= index < self.config.num_layers}
                               | {self.config.num_layers}):
                x = plan.run(x, cos, sin, cache, start, stop, plan_rows, self.config.num_heads,
                             self.config.num_kv_heads, self.config.head_dim)
                if stop - 1 in wanted:
                    hidden[stop - 1] = x
                start = stop
        else:
            layer_mask = self.layer_mask(attn_mask, rows)
            for index, layer in enumerate(self.model.layers):
                if index in sliding:
                    x = layer(x, local[0], local[1], cache, index, local[2], local[3])
                else:
                    x = layer(x, cos, sin, cache, index, layer_mask, rows)
                if index in wanted:
                    hidden[index] = x
        if self.config.num_layers in wanted:  # every row's normed state, even when one row's logits are asked
            x = self.model.norm(x)
            hidden[self.config.num_layers] = x
            if last_logits_only:
                x = x[:, -1:]
        else:
            x = self.model.norm(x[:, -1:] if last_logits_only else x)
        logits = self.lm_head(x).float()
        if c.final_logit_softcap is not None:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return ForwardOutput(logits=logits, hidden_states=hidden, experts_per_layer=self.experts_touched())

    def layer_mask(self, attn_mask: torch.Tensor | None, rows: RowAttention | None) -> torch.Tensor | GroupedMask | None:
        """The mask the full-attention layers take: on the CPU a masked forward's grouped once for them all
        (models/grouped_attention.py); elsewhere, and for sinks (their own torch attention), as it is."""
        if attn_mask is None or rows is not None or self.device.type != "cpu" or self.config.attention_sinks:
            return attn_mask
        grouped = GroupedMask.of(attn_mask, self.config.num_heads // self.config.num_kv_heads, self.dtype)
        return attn_mask if grouped is None else grouped

    def experts_touched(self) -> float | None:
        """The distinct experts the last forward ran, averaged over the mixture layers (None: a dense model)."""
        mixtures = [layer.mlp.touched for layer in self.model.layers if isinstance(layer.mlp, MixtureOfExperts)]
        return sum(mixtures) / len(mixtures) if mixtures else None

    def window_inputs(
        self,
        positions: torch.Tensor,  # (B, T)
        past: int,
        attn_mask: torch.Tensor | None,  # (B or 1, T, past + T) bool, or None: causal
        rows: RowAttention | None,
    ) -> tuple[torch.Tensor | None, RowAttention | None] | None:
        """The attention mask and rows of the sliding-window layers (base.sliding_window_mask), or None while
        every row's window still starts at slot 0."""
        first_key = (positions - self.config.sliding_window + 1).clamp(min=0)  # (B, T)
        if int(first_key.max()) == 0:
            return None
        if rows is not None:
            return None, rows.windowed(first_key[0].tolist())
        if attn_mask is None:  # a one-token step or a first prefill
            attn_mask = causal_attention_mask(past, positions.shape[1], positions.device)
        return sliding_window_mask(attn_mask, positions, self.config.sliding_window), None
