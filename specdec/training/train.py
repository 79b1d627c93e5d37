"""Fitting an EAGLE head or Medusa heads to cached target features, with checkpoints and validation.

EAGLE loss (per pair j: token j+1 and feature f_j -> predicted f_{j+1}): smooth-L1 to the target's
f_{j+1} plus cross-entropy of the draft-vocabulary scores against the target's own top-8 distribution
after token j+1 (self-distillation). A second pass feeds the head its own predictions as input
features (EAGLE-3's "training-time test", one step deep), as drafting beyond depth 1 does. Input
features get a little noise (EAGLE) for the same reason.

EAGLE-3 loss: cross-entropy only (the head predicts tokens, not features), over three passes of
training-time test: the first on the fused target features, each next one on the head's own outputs of
the pass before (gradients flow through them, as in EAGLE-3), as drafting depths 1-3 see them.

Medusa loss: head k on f_j, cross-entropy against the target's distribution after token j+k.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specdec.heads.eagle import EagleHead, EagleShape
from specdec.heads.eagle3 import Eagle3Head, Eagle3Shape, default_feature_layers
from specdec.heads.medusa import MedusaHeads, MedusaShape
from specdec.heads.target_parts import embed, lm_head_rows
from specdec.training.features import FeatureSet
from specdec.training.precision import training_arithmetic

RANKS = 10  # Medusa rank accuracies recorded per head


@dataclass(frozen=True)
class TrainConfig:
    kind: str  # "eagle", "eagle3" or "medusa"
    steps: int = 600
    batch_windows: int = 8
    learning_rate: float = 1e-3
    warmup_steps: int = 30
    draft_vocab_size: int = 8192
    medusa_heads: int = 4
    intermediate_size: int = 0  # EAGLE head MLP width; 0 = the target's
    feature_layers: tuple[int, ...] = ()  # EAGLE-3: the target layer ids fused; () = low, middle and high
    ttt_passes: int = 3  # EAGLE-3: training-time test depth
    classification_weight: float = 0.5
    feature_noise: float = 0.05  # std of the noise on input features, relative to their RMS
    checkpoint_every: int = 50
    seed: int = 0
    precision: str = "float32"  # a step's matrix products: "float32" or "bfloat16" (training/precision.py)

    def to_dict(self) -> dict:
        return asdict(self)


def eagle3_shape(config: TrainConfig, target_model) -> Eagle3Shape:
    c = target_model.config
    shape = Eagle3Shape(config.intermediate_size or c.intermediate_size,
                        tuple(config.feature_layers) or default_feature_layers(c.num_layers))
    shape.check_target(c.num_layers)
    return shape


def feature_layers(config: TrainConfig, target_model) -> tuple[int, ...]:
    """The target's hidden layers the head trains on, as the engine indexes them."""
    if config.kind == "eagle3":
        return eagle3_shape(config, target_model).engine_layers()
    return (target_model.num_layers,)


def new_head(config: TrainConfig, target_model) -> torch.nn.Module:
    if config.kind == "eagle3":
        return Eagle3Head(target_model.config, eagle3_shape(config, target_model))
    if config.kind == "eagle":
        head = EagleHead(target_model.config, EagleShape(config.intermediate_size or target_model.config.intermediate_size))
        with torch.no_grad():  # start by passing the input feature through: f_{j+1} ~ f_j
            hidden = target_model.hidden_size
            head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
            head.fc.weight[:, :hidden].mul_(0.1)
            head.fc.bias.zero_()
        return head
    return MedusaHeads(target_model.hidden_size, MedusaShape(config.medusa_heads))


class Objective:
    """Losses and accuracies of a head on a batch of windows."""

    def __init__(self, config: TrainConfig, target_model, draft_vocab: torch.Tensor):
        self.config, self.target_model = config, target_model
        self.rows = lm_head_rows(target_model, draft_vocab)  # (N, C) constant
        self.index_of = torch.full((target_model.vocab_size,), -1, dtype=torch.int64)
        self.index_of[draft_vocab] = torch.arange(draft_vocab.shape[0])

    def soft_ce(self, hidden: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of draft scores (..., N) against the target's top-8 law restricted to the draft vocab."""
        logp = torch.log_softmax((hidden @ self.rows.T).float(), dim=-1)  # (..., N): float32 under autocast too
        index = self.index_of[top_ids]  # (..., 8), -1 outside the draft vocabulary
        probs = top_probs * (index >= 0)
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-6)
        return -(probs * logp.gather(-1, index.clamp_min(0))).sum(-1).mean()

    def hits(self, hidden: torch.Tensor, top_ids: torch.Tensor, ranks: int = 1) -> torch.Tensor:
        """(ranks,) share of positions where the head's rank-r token is the target's top-1."""
        order = (hidden @ self.rows.T).topk(ranks, dim=-1).indices  # (..., ranks)
        truth = self.index_of[top_ids[..., 0]].unsqueeze(-1)
        return (order == truth).flatten(0, -2).float().mean(0)

    def noisy(self, features: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if not self.config.feature_noise or generator is None:
            return features
        scale = features.pow(2).mean(-1, keepdim=True).sqrt() * self.config.feature_noise
        return features + torch.randn(features.shape, generator=generator) * scale

    def eagle(self, head: EagleHead, batch: FeatureSet, generator=None) -> tuple[torch.Tensor, dict]:
        tokens, features = batch.tokens, batch.features.float()  # (B, L), (B, L, C)
        count, length = tokens.shape
        embeds = embed(self.target_model, tokens[:, 1:]).float()  # (B, L-1, C) tokens j+1
        positions = torch.arange(length - 1).expand(count, -1)
        predicted = head(embeds, self.noisy(features[:, :-1], generator), positions,
                         head.new_cache(length - 1, count), None)  # (B, L-1, C) ~ f_{j+1}
        # Second pass: the head's own (detached) predictions as input features.
        again = head(embeds[:, 1:], predicted[:, :-1].detach(), positions[:, 1:],
                     head.new_cache(length - 2, count), None)  # (B, L-2, C) ~ f_{j+2}
        weight = self.config.classification_weight
        first = F.smooth_l1_loss(predicted, features[:, 1:]) + weight * self.soft_ce(
            predicted, batch.top_ids[:, 1:], batch.top_probs[:, 1:])
        second = F.smooth_l1_loss(again, features[:, 2:]) + weight * self.soft_ce(
            again, batch.top_ids[:, 2:], batch.top_probs[:, 2:])
        with torch.no_grad():
            figures = {"top1": float(self.hits(predicted, batch.top_ids[:, 1:])[0]),
                       "top1_own_input": float(self.hits(again, batch.top_ids[:, 2:])[0])}
        return first + second, figures

    def eagle3(self, head: Eagle3Head, batch: FeatureSet, generator=None) -> tuple[torch.Tensor, dict]:
        tokens, features = batch.tokens, batch.features.float()  # (B, L), (B, L, C x layers)
        count, length = tokens.shape
        hidden = head.fuse(self.noisy(features[:, :-1], generator))  # (B, L-1, C) of tokens j
        losses, figures = [], {}
        for depth in range(min(self.config.ttt_passes, length - 1)):
            # Pass d: pairs (state of token j, token j+1) for j >= d predict the token after j+1.
            width = length - 1 - depth
            embeds = embed(self.target_model, tokens[:, 1 + depth:]).float()  # (B, width, C)
            positions = torch.arange(depth, length - 1).expand(count, -1)
            hidden = head(embeds, hidden[:, :width], positions, head.new_cache(width, count), None)
            scored = head.scoring_input(hidden)
            losses.append(self.soft_ce(scored, batch.top_ids[:, 1 + depth:], batch.top_probs[:, 1 + depth:]))
            with torch.no_grad():
                figures["top1" if depth == 0 else f"top1_depth{depth + 1}"] = float(
                    self.hits(scored, batch.top_ids[:, 1 + depth:])[0])
        return torch.stack(losses).sum(), figures

    def medusa(self, heads: MedusaHeads, batch: FeatureSet, generator=None) -> tuple[torch.Tensor, dict]:
        features = batch.features.float()  # (B, L, C)
        predicted = heads(self.noisy(features, generator))  # (H, B, L, C)
        losses, figures = [], {}
        for k in range(heads.shape.num_heads):
            shift = k + 1  # head k on f_j predicts the token after token j+k+1
            losses.append(self.soft_ce(predicted[k][:, :-shift], batch.top_ids[:, shift:], batch.top_probs[:, shift:]))
            with torch.no_grad():
                figures[f"head{k + 1}_top1"] = float(self.hits(predicted[k][:, :-shift], batch.top_ids[:, shift:])[0])
        return torch.stack(losses).mean(), figures

    def __call__(self, module, batch: FeatureSet, generator=None) -> tuple[torch.Tensor, dict]:
        objectives = {"eagle": self.eagle, "eagle3": self.eagle3, "medusa": self.medusa}
        return objectives[self.config.kind](module, batch, generator)

    @torch.no_grad()
    def validate(self, module, data: FeatureSet) -> dict:
        totals: dict[str, float] = {}
        batches = [slice(i, i + self.config.batch_windows) for i in range(0, len(data), self.config.batch_windows)]
        for part in batches:
            batch = FeatureSet(data.tokens[part], data.features[part], data.top_ids[part], data.top_probs[part])
            loss, figures = self(module, batch)
            for key, value in {"loss": float(loss), **figures}.items():
                totals[key] = totals.get(key, 0.0) + value / len(batches)
        if self.config.kind == "medusa":
            totals["rank_accuracy"] = self.rank_accuracy(module, data)
        return totals

    def rank_accuracy(self, heads: MedusaHeads, data: FeatureSet) -> list[list[float]]:
        """[k][r]: how often head k's rank-r token is the target's choice (the tree's calibration)."""
        predicted = heads(data.features.float())  # (H, W, L, C)
        table = []
        for k in range(heads.shape.num_heads):
            shift = k + 1
            table.append([round(float(v), 4) for v in self.hits(predicted[k][:, :-shift], data.top_ids[:, shift:], RANKS)])
        return table


def learning_rate(config: TrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def fit(config: TrainConfig, target_model, train: FeatureSet, draft_vocab: torch.Tensor, checkpoint_path,
        progress: bool = True) -> tuple[torch.nn.Module, dict]:
    """Train from scratch or resume from checkpoint_path; returns the module and training figures."""
    torch.manual_seed(config.seed)
    module = new_head(config, target_model)
    optimizer = torch.optim.AdamW(module.parameters(), lr=config.learning_rate, weight_decay=0.0)
    objective = Objective(config, target_model, draft_vocab)
    generator = torch.Generator().manual_seed(config.seed)
    start, elapsed = 0, 0.0
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        if state["config"] == config.to_dict() and torch.equal(state["draft_vocab"], draft_vocab):
            module.load_state_dict(state["module"])
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            start, elapsed = state["step"], state["seconds"]
    order = torch.randperm(len(train), generator=generator)
    cursor = (start * config.batch_windows) % len(train)
    recent: list[float] = []
    bar = tqdm(total=config.steps, initial=start, desc=f"train {config.kind}", unit="step", disable=not progress)
    began = time.perf_counter() - elapsed
    for step in range(start, config.steps):
        picks = order[(cursor + torch.arange(config.batch_windows)) % len(train)]
        cursor = (cursor + config.batch_windows) % len(train)
        batch = FeatureSet(train.tokens[picks], train.features[picks], train.top_ids[picks], train.top_probs[picks])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        with training_arithmetic(config.precision, next(module.parameters()).device.type):
            loss, figures = objective(module, batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [figures[next(iter(figures))]])[-20:]
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{sum(recent) / len(recent):.3f}")
        bar.update(1)
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            save_checkpoint(checkpoint_path, module, optimizer, generator, step + 1, time.perf_counter() - began,
                            config, draft_vocab)
    bar.close()
    return module.eval(), {"steps": config.steps, "seconds": round(time.perf_counter() - began, 1),
                           "windows": len(train), "tokens": int(train.tokens.numel())}


def save_checkpoint(path, module, optimizer, generator, step, seconds, config, draft_vocab) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"module": module.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                "step": step, "seconds": seconds, "config": config.to_dict(), "draft_vocab": draft_vocab}, partial)
    partial.replace(path)
