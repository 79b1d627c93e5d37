"""The target's features over a corpus, computed once and cached on disk.

For every token of every window: the final normed hidden state, or the hidden states of the layers an
EAGLE-3 head fuses, side by side (float16), and the target's top
predictions after it (ids and probabilities, float16): everything a head trains on, so training never
runs the target again. Shards of `shard_windows` windows are written atomically; an interrupted run
resumes at the first missing shard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specdec.models.base import positions_after

TOP_K = 8


@dataclass
class FeatureSet:
    tokens: torch.Tensor  # (W, L) int64
    features: torch.Tensor  # (W, L, C) float16: the feature of token i (its LM head gives token i+1)
    top_ids: torch.Tensor  # (W, L, TOP_K) int64: the target's most likely tokens after token i
    top_probs: torch.Tensor  # (W, L, TOP_K) float32

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def split(self, validation_fraction: float) -> tuple["FeatureSet", "FeatureSet"]:
        """(train, validation): the last windows are held out."""
        held = max(1, int(len(self) * validation_fraction))
        cut = len(self) - held
        parts = [(t[:cut], t[cut:]) for t in (self.tokens, self.features, self.top_ids, self.top_probs)]
        return FeatureSet(*(p[0] for p in parts)), FeatureSet(*(p[1] for p in parts))


def joined_features(out, layers: tuple[int, ...]) -> torch.Tensor:
    """(B, T, C x layers): a forward's hidden states at `layers`, side by side (as drafting sees them)."""
    return torch.cat([out.hidden_states[layer] for layer in layers], dim=-1)


@torch.inference_mode()
def compute_shard(model, windows: list[list[int]], layers: tuple[int, ...] | None = None) -> dict[str, torch.Tensor]:
    """layers: the hidden layers recorded as features (None: the final normed state)."""
    layers = layers or (model.num_layers,)
    tokens = torch.tensor(windows, device=model.device)  # (B, L)
    batch, length = tokens.shape
    cache = model.new_cache(batch, length)
    out = model.forward(tokens, positions_after(0, length, batch, tokens.device), cache, hidden_layers=layers)
    probs = torch.softmax(out.logits, dim=-1)  # (B, L, V)
    top_probs, top_ids = probs.topk(TOP_K, dim=-1)
    return {"tokens": tokens.to(torch.int32).cpu(),
            "features": joined_features(out, layers).to(torch.float16).cpu(),
            "top_ids": top_ids.to(torch.int32).cpu(), "top_probs": top_probs.to(torch.float16).cpu()}


def cache_features(model, windows: list[list[int]], out_dir: Path, shard_windows: int = 4,
                   progress: bool = True, layers: tuple[int, ...] | None = None) -> FeatureSet:
    """Compute (or reuse) the features of `windows` under out_dir; return them all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = [windows[i: i + shard_windows] for i in range(0, len(windows), shard_windows)]
    (out_dir / "corpus.json").write_text(json.dumps({"windows": len(windows), "window": len(windows[0]),
                                                     "shard_windows": shard_windows}))
    parts: list[dict[str, torch.Tensor]] = []
    with tqdm(total=sum(map(len, windows)), desc="target features", unit="tok", unit_scale=True,
              disable=not progress) as bar:
        for index, shard in enumerate(shards):
            path = out_dir / f"shard-{index:05d}.safetensors"
            if path.exists():
                part = load_file(str(path))
            else:
                part = compute_shard(model, shard, layers)
                partial = path.with_suffix(".partial")
                save_file(part, str(partial))
                partial.replace(path)
            parts.append(part)
            bar.update(sum(map(len, shard)))
    def joined(key: str) -> torch.Tensor:
        return torch.cat([p[key] for p in parts])

    return FeatureSet(joined("tokens").long(), joined("features"), joined("top_ids").long(),
                      joined("top_probs").float())


def draft_vocabulary(features: FeatureSet, size: int) -> tuple[torch.Tensor, float]:
    """The `size` tokens the target predicts (top-1) most often, and the share of predictions they cover."""
    top1 = features.top_ids[..., 0].flatten()
    counts = torch.bincount(top1)
    size = min(size, int((counts > 0).sum()))
    chosen = counts.topk(size).indices
    return chosen, float(counts[chosen].sum() / counts.sum())


def pack_sequences(sequences: list[dict[str, torch.Tensor]], window: int) -> FeatureSet:
    """Concatenate the sequences and cut into windows of `window` tokens (each token keeps the feature
    computed in its own sequence)."""
    joined = {key: torch.cat([s[key] for s in sequences]) for key in sequences[0]}
    count = joined["tokens"].shape[0] // window
    cut = {key: value[: count * window].reshape(count, window, *value.shape[1:]) for key, value in joined.items()}
    return FeatureSet(cut["tokens"].long(), cut["features"], cut["top_ids"].long(), cut["top_probs"].float())


def concatenate(sets: list[FeatureSet]) -> FeatureSet:
    sets = [s for s in sets if len(s)]
    return FeatureSet(*(torch.cat([getattr(s, key) for s in sets])
                        for key in ("tokens", "features", "top_ids", "top_probs")))
