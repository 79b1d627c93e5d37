"""Heads on disk: DIR/head.safetensors (bfloat16 weights + the draft vocabulary) and DIR/head.json.

head.json records the kind ("eagle", "eagle3" or "medusa"), the module's shape, the target it was trained for
(name, sha256 of its weight files and of its vocabulary, hidden size) and the feature layer tapped, plus
training figures. Loading checks the target: a head trained on other weights would draft garbage
(exactly, but slowly), so it is refused with a clear error instead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.errors import CorruptModelError, InvalidParameterError
from specdec.heads.eagle import EagleHead, EagleShape
from specdec.heads.eagle3 import Eagle3Head, Eagle3Shape
from specdec.heads.medusa import MedusaHeads, MedusaShape
from specdec.heads.target_parts import native_model
from specdec.models.fingerprint import tokenizer_sha256, weights_identities, weights_sha256
from specdec.paths import building_directory

HEAD_KINDS = ("eagle", "eagle3", "medusa")
FORMAT_VERSION = 1


@dataclass
class TargetIdentity:
    name: str
    weights_sha256: str
    tokenizer_sha256: str
    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, target) -> "TargetIdentity":
        """target: a LoadedModel."""
        return cls(target.name, weights_sha256(target.path), tokenizer_sha256(target.tokenizer),
                   target.model.hidden_size, target.model.vocab_size)


@dataclass(frozen=True)
class HeadInfo:
    """What a head says of itself: head.json read and checked once, or an imported head's config."""

    kind: str  # one of HEAD_KINDS
    target: TargetIdentity | None = None  # the weights it was trained for; None when a head records none
    target_name: str | None = None  # how it names its target (for an imported head: maybe a hub id)
    training: dict = field(default_factory=dict)  # the figures `specdec train` recorded (a free-form record)
    shape: dict = field(default_factory=dict)  # the module's shape (its Shape's fields)

    @classmethod
    def parse(cls, data: dict, where: str) -> "HeadInfo":
        if data.get("kind") not in HEAD_KINDS or data.get("format_version") != FORMAT_VERSION:
            raise CorruptModelError(f"{where}: not a specdec head (kind {data.get('kind')!r}, "
                                    f"format {data.get('format_version')!r})")
        return cls(data["kind"], target_identity(data.get("target"), where), (data.get("target") or {}).get("name"),
                   data.get("training") or {}, data.get("shape") or {})

    @property
    def validation(self) -> dict:
        """The held-out figures of training ({} for a head trained elsewhere)."""
        return self.training.get("validation") or {}


def target_identity(recorded: dict | None, where: str) -> TargetIdentity | None:
    """A recorded target's identity: all of TargetIdentity's fields, or None when none is recorded."""
    if not recorded or set(recorded) == {"name"}:
        return None
    try:
        return TargetIdentity(**{f.name: recorded[f.name] for f in fields(TargetIdentity)})
    except KeyError as missing:
        raise CorruptModelError(f"{where}: the recorded target lacks {missing}") from None


@dataclass
class LoadedHead:
    info: HeadInfo
    module: nn.Module  # EagleHead, Eagle3Head or MedusaHeads, float32, eval mode, on the target's device
    draft_vocab: torch.Tensor  # (N,) int64 target token ids the head scores
    # A head trained elsewhere may bring its own LM-head rows and token embeddings (specdec's heads use
    # the target's): (N, C) and (V, C), or None.
    lm_rows: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None

    @property
    def kind(self) -> str:
        return self.info.kind

    def feature_layers(self, target_model) -> tuple[int, ...]:
        """The target's hidden layers the head reads, as the engine indexes them."""
        if self.kind == "eagle3":
            return self.module.shape.engine_layers()
        return (target_model.num_layers,)  # the final normed state


def build_head(kind: str, target_model, shape: dict) -> nn.Module:
    if kind == "eagle":
        return EagleHead(target_model.config, EagleShape(**shape))
    if kind == "eagle3":
        return Eagle3Head(target_model.config, Eagle3Shape(**shape))
    if kind == "medusa":
        return MedusaHeads(target_model.hidden_size, MedusaShape(**shape))
    raise InvalidParameterError(f"unknown head kind {kind!r} (choose from {', '.join(HEAD_KINDS)})")


def save_head(out_dir: Path, kind: str, module: nn.Module, draft_vocab: torch.Tensor, target: TargetIdentity,
              training: dict) -> None:
    """Write the head atomically: an interrupted save leaves no half-written directory behind."""
    out_dir = Path(out_dir)
    info = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "shape": module.shape.to_dict(),
        "target": asdict(target),
        "feature_layer": list(module.shape.feature_layers) if kind == "eagle3" else "final_norm",
        "draft_vocab_size": int(draft_vocab.shape[0]),
        "training": training,
    }
    tensors = {name: value.detach().to(torch.bfloat16).contiguous() for name, value in module.state_dict().items()}
    tensors["draft_vocab"] = draft_vocab.to(torch.int32).contiguous()
    with building_directory(out_dir) as partial:
        save_file(tensors, str(partial / "head.safetensors"))
        (partial / "head.json").write_text(json.dumps(info, indent=2) + "\n")


def read_head_info(path: Path) -> HeadInfo:
    path = Path(path)
    if not (path / "head.json").is_file() or not (path / "head.safetensors").is_file():
        raise InvalidParameterError(f"{path}: not a head directory (expected head.json and head.safetensors)")
    try:
        data = json.loads((path / "head.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptModelError(f"{path}/head.json: unreadable ({exc})") from None
    info = HeadInfo.parse(data, f"{path}/head.json")
    if info.target is None:
        raise CorruptModelError(f"{path}/head.json: no target recorded")
    return info


def check_target(info: HeadInfo, target, path: Path) -> None:
    """Refuse a head trained for other weights or another tokenizer."""
    trained = info.target
    model = target.model
    if trained.hidden_size != model.hidden_size or trained.vocab_size != model.vocab_size:
        raise InvalidParameterError(
            f"{path}: this {info.kind} head was trained for {trained.name!r} (hidden size "
            f"{trained.hidden_size}, vocabulary {trained.vocab_size}), not for {target.name!r}")
    if trained.tokenizer_sha256 != tokenizer_sha256(target.tokenizer):
        raise InvalidParameterError(f"{path}: this head was trained for {trained.name!r}, whose tokenizer "
                                    f"differs from {target.name!r}'s")
    if trained.weights_sha256 not in weights_identities(target.path):
        raise InvalidParameterError(f"{path}: this head was trained for {trained.name!r} (weights sha256 "
                                    f"{trained.weights_sha256[:12]}...), not for {target.name!r}'s weights")


def load_head(path: Path, target, kinds: tuple[str, ...] = HEAD_KINDS) -> LoadedHead:
    """Load the head at `path` for `target` (a LoadedModel), checking it was trained for that target and
    is of one of `kinds`."""
    path = Path(path).expanduser()
    info = read_head_info(path)
    if info.kind not in kinds:
        raise InvalidParameterError(f"{path}: this is a {info.kind} head, not a {' or '.join(kinds)} head")
    model = native_model(target.model)
    check_target(info, target, path)
    try:
        tensors = load_file(str(path / "head.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise CorruptModelError(f"{path}/head.safetensors: corrupt ({exc})") from None
    draft_vocab = tensors.pop("draft_vocab", None)
    if draft_vocab is None:
        raise CorruptModelError(f"{path}/head.safetensors: no draft_vocab tensor")
    module = build_head(info.kind, model, info.shape)
    try:
        module.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    except RuntimeError as exc:
        raise CorruptModelError(f"{path}: weights do not match the head's shape ({str(exc).splitlines()[0]})") from None
    return LoadedHead(info, module.to(model.device).eval(), draft_vocab.to(torch.int64))
