"""`specdec train distill`: a draft model distilled toward its target (DistillSpec, Zhou et al. 2024), saved as a
LoRA adapter that `draft:MODEL@adapter=DIR` merges into the draft at load.

A draft pays by how often its next token is the target's, so it learns the target's own next-token law on
the corpus and the target's answers to it (the same cached windows and top-8 probabilities heads train on):
the loss is the cross-entropy of the draft's log-probabilities against the target's top-8 law (forward KL up
to a constant). The draft's LM head is scored over ids < head_vocab only, where it drafts with `vocab=N`: a
token it can never propose teaches it nothing. Only the LoRA matrices train; the draft's weights stay as
they are, so the adapter is small and the draft merged with it quantizes and runs as before.

The draft trains in transformers (its float32 checkpoint, PEFT's LoRA on every projection): the native
runtime writes its KV cache in place, which autograd cannot differentiate through. PEFT names the matrices
by module path, which the native model shares, so the adapter merges into either.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.drafters.registry import make_drafter
from specdec.errors import InvalidParameterError
from specdec.models.sources.checkpoint import ensure_float32_weights
from specdec.models.sources.loading import resolve_model_dir
from specdec.models.sources.tokenizer_files import load_tokenizer
from specdec.training.command import drafting_figures, target_windows
from specdec.training.features import FeatureSet
from specdec.training.precision import training_arithmetic

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WARMUP_STEPS = 10


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 300
    batch_windows: int = 4
    learning_rate: float = 2e-4
    rank: int = 16  # LoRA rank; alpha is twice it
    head_vocab: int | None = None  # the draft drafts with vocab=N: only ids < N are scored
    precision: str = "float32"
    seed: int = 0
    device: str = "cpu"


def distillation_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, L, V) of the draft over ids < V; top_ids, top_probs (B, L, 8): the target's law after each
    token. -> (cross-entropy against the target's top-8 law renormalized over ids < V, the share of positions
    where the draft's argmax is the target's)."""
    vocab = logits.shape[-1]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    weights = top_probs * (top_ids < vocab)  # a target token the draft cannot propose weighs nothing
    picked = log_probs.gather(-1, top_ids.clamp_max(vocab - 1))  # (B, L, 8)
    loss = -((weights * picked).sum(-1) / weights.sum(-1).clamp_min(1e-6)).mean()
    agreement = (log_probs.argmax(-1) == top_ids[..., 0]).float().mean()
    return loss, agreement


class LoraDraft:
    """The draft model in transformers with LoRA matrices on its projections: the only trained parameters."""

    def __init__(self, model_dir: Path, config: DistillConfig):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        base = AutoModelForCausalLM.from_pretrained(str(ensure_float32_weights(model_dir)), dtype=torch.float32)
        base.to(config.device)
        self.model = get_peft_model(base, LoraConfig(r=config.rank, lora_alpha=2 * config.rank, lora_dropout=0.0,
                                                     target_modules=LORA_MODULES))
        self.config = config
        rows = base.get_output_embeddings().weight.shape[0]
        self.head_vocab = min(config.head_vocab or rows, rows)
        self.softcap = getattr(base.config, "final_logit_softcapping", None)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, L) -> the draft's logits (B, L, head_vocab), in the configured arithmetic."""
        base = self.model.get_base_model()
        with training_arithmetic(self.config.precision, torch.device(self.config.device).type):
            hidden = base.get_decoder()(input_ids=tokens).last_hidden_state  # (B, L, C)
            logits = hidden @ base.get_output_embeddings().weight[: self.head_vocab].T
        if self.softcap:
            logits = torch.tanh(logits.float() / self.softcap) * self.softcap
        return logits

    def loss(self, windows: FeatureSet, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.config.device
        return distillation_loss(self.logits(windows.tokens[rows].to(device)), windows.top_ids[rows].to(device),
                                 windows.top_probs[rows].to(device))

    @torch.no_grad()
    def validate(self, windows: FeatureSet) -> dict[str, float]:
        losses, agreements = [], []
        for start in range(0, len(windows), self.config.batch_windows):
            rows = torch.arange(start, min(start + self.config.batch_windows, len(windows)))
            loss, agreement = self.loss(windows, rows)
            losses.append(float(loss) * len(rows))
            agreements.append(float(agreement) * len(rows))
        return {"loss": round(sum(losses) / len(windows), 4), "top1_agreement": round(sum(agreements) / len(windows), 4)}

    def fit(self, train: FeatureSet, progress: bool = True) -> list[float]:
        """config.steps AdamW steps over shuffled windows (cosine learning rate after a short warmup); the
        losses of every step."""
        config, params = self.config, self.parameters()
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS)
                                                     * 0.5 * (1 + math.cos(math.pi * step / config.steps)))
        generator = torch.Generator().manual_seed(config.seed)
        order, position, losses = torch.randperm(len(train), generator=generator), 0, []
        with tqdm(range(config.steps), desc="distilling the draft", unit="step", disable=not progress) as bar:
            for _ in bar:
                if position + config.batch_windows > len(order):
                    order, position = torch.randperm(len(train), generator=generator), 0
                rows = order[position: position + config.batch_windows]
                position += config.batch_windows
                loss, agreement = self.loss(train, rows)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                optimizer.zero_grad()
                schedule.step()
                losses.append(float(loss))
                bar.set_postfix(loss=f"{float(loss):.3f}", agreement=f"{float(agreement):.2f}")
        return losses

    def save(self, out_dir: Path, figures: dict) -> None:
        """The adapter (PEFT's files) and distill.json, written beside out_dir first and then moved in."""
        partial = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.model.save_pretrained(str(partial))
        (partial / "README.md").unlink(missing_ok=True)  # PEFT's model-card template, empty here
        (partial / "distill.json").write_text(json.dumps(figures, indent=1))
        shutil.rmtree(out_dir, ignore_errors=True)
        partial.replace(out_dir)


def check_same_vocabulary(target, draft_name: str, draft_dir: Path) -> None:
    """The target's top-8 ids must mean the draft's tokens."""
    if load_tokenizer(draft_dir).get_vocab() != target.tokenizer.get_vocab():
        raise InvalidParameterError(f"{draft_name}: its tokenizer differs from {target.name}'s; distillation needs "
                                    "a draft that reads the target's token ids")


def drafted_tau(target, spec: str) -> dict:
    """tau and exactness of the draft `spec` drafting for the target, as a trained head is measured."""
    return drafting_figures(target, make_drafter(spec, target, str(target.model.device), "float32"))


def draft_spec(draft_name: str, draft_weights: str, head_vocab: int | None, adapter: Path | None) -> str:
    options = [f"weights={draft_weights}"] + ([f"vocab={head_vocab}"] if head_vocab else [])
    return f"draft:{draft_name}@" + ",".join(options + ([f"adapter={adapter}"] if adapter else []))


def run_distillation(target, draft: str, out_dir: Path, corpus, config: DistillConfig, draft_weights: str,
                     progress: bool = True) -> dict:
    """Distill `draft` (a model spec) toward `target` (a LoadedModel, native backend) on `corpus`; save the
    adapter to out_dir and return its figures (held-out loss and agreement, tau before and after)."""
    draft_name, draft_dir = resolve_model_dir(draft)
    check_same_vocabulary(target, draft_name, draft_dir)
    train, validation = target_windows(target, corpus, progress=progress)
    lora = LoraDraft(draft_dir, config)
    before = lora.validate(validation)
    losses = lora.fit(train, progress)
    after = lora.validate(validation)
    figures = {"target": target.name, "draft": draft_name, "steps": config.steps, "config": asdict(config),
               "corpus": asdict(corpus), "train_windows": len(train), "final_losses": losses[-10:],
               "validation": {"before": before, "after": after}}
    lora.save(out_dir, figures)
    print("specdec: measuring the draft with and without the adapter on its target", file=sys.stderr)
    figures["end_to_end"] = {
        "without": drafted_tau(target, draft_spec(draft, draft_weights, config.head_vocab, None)),
        "with": drafted_tau(target, draft_spec(draft, draft_weights, config.head_vocab, out_dir))}
    partial = out_dir / "distill.json.partial"
    partial.write_text(json.dumps(figures, indent=1))
    partial.replace(out_dir / "distill.json")
    return figures
