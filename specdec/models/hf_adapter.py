"""Any transformers AutoModelForCausalLM behind specdec's CausalLM interface.

The breadth path: architectures the native decoder does not cover still work as
target or draft. Rollback and compaction edit the DynamicCache's per-layer
key/value tensors directly, which avoids `crop`, whose argument changed meaning
in transformers 5.x (a negative count of tokens to remove, no longer a length).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.models.base import (CausalLM, ForwardOutput, ModelCache, causal_attention_mask, forward_each,
                                 sliding_window_mask)


class HFCache(ModelCache):
    """A transformers DynamicCache plus the rollback operations the engine needs."""

    def __init__(self, max_length: int):
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.max_length = max_length

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self._layers() for t in (layer.keys, layer.values))

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", True) and layer.keys is not None]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        for layer in self._layers():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]

    def compact(self, prefix_length: int, keep: Sequence[int]) -> None:
        keep_list = list(keep)
        if any(k < prefix_length or k >= self.length for k in keep_list):
            raise ValueError(f"compact: slots {keep_list} outside [{prefix_length}, {self.length})")
        for layer in self._layers():
            index = torch.tensor(list(range(prefix_length)) + keep_list, device=layer.keys.device)
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)


class HFCausalLM(CausalLM):
    def __init__(self, model):
        self.model = model.eval()
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.num_layers = text_config.num_hidden_layers
        self.hidden_size = text_config.hidden_size
        self.max_context = getattr(text_config, "max_position_embeddings", 4096)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def weights_module(self) -> torch.nn.Module:
        return self.model

    @property
    def weight_format(self) -> str:
        return str(self.model.dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def layer_kinds(self) -> list[str]:
        """Each layer's attention kind as transformers names it ("full_attention", "sliding_attention")."""
        config = self.model.config
        if getattr(config, "layer_types", None):
            return list(config.layer_types)
        sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> HFCache:
        return HFCache(max_length or self.max_context)

    @torch.inference_mode()
    def forward_batch(self, requests, hidden_layers=()):
        return forward_each(self, requests, hidden_layers)  # transformers' caches: one request at a time

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T)
        positions: torch.Tensor,  # (B, T)
        cache: HFCache,
        attn_mask: torch.Tensor | None = None,  # (B or 1, T, cache.length + T) bool
        hidden_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> ForwardOutput:
        batch, num_new = tokens.shape
        past = cache.length
        if past + num_new > cache.max_length:
            raise ValueError(f"KV cache full: {past} cached + {num_new} new > capacity {cache.max_length}")
        if attn_mask is None:
            attn_mask = causal_attention_mask(past, num_new, tokens.device)
        # transformers takes a custom 4D mask as is: (B, 1, T, S), True = attend. Its sliding-window layers
        # then need the window in the mask itself (a dict per layer kind where the model mixes kinds).
        mask4d: torch.Tensor | dict[str, torch.Tensor] = attn_mask.expand(batch, -1, -1).unsqueeze(1)
        kinds = set(self.layer_kinds)
        if "sliding_attention" in kinds:
            windowed = sliding_window_mask(attn_mask, positions, self.model.config.sliding_window).unsqueeze(1)
            mask4d = windowed if kinds == {"sliding_attention"} else {"full_attention": mask4d,
                                                                      "sliding_attention": windowed}
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            attention_mask=mask4d,
            past_key_values=cache.cache,
            use_cache=True,
            output_hidden_states=bool(hidden_layers),
            logits_to_keep=1 if last_logits_only else 0,
        )
        # transformers: hidden_states[0] is the embedding output, [i + 1] the output of
        # layer i, and the last entry has already passed the final norm, so the
        # last layer's pre-norm output (index num_layers - 1) is not available.
        if self.num_layers - 1 in hidden_layers:
            raise ValueError("the transformers adapter exposes the last layer only after the norm (index num_layers)")
        hidden = {i: out.hidden_states[i + 1] for i in hidden_layers if i < self.num_layers - 1}
        if self.num_layers in hidden_layers:
            hidden[self.num_layers] = out.hidden_states[-1]
        return ForwardOutput(logits=out.logits.float(), hidden_states=hidden)

    __call__ = forward
