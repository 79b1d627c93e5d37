"""Building EAGLE and Medusa drafters from a spec: `eagle[:HEAD_DIR][@depth=D,topk=W,budget=N]`,
`medusa[:HEAD_DIR][@budget=N]`. Without HEAD_DIR, the head shipped with specdec for the target. An
eagle HEAD_DIR holds a specdec EAGLE or EAGLE-3 head, or a speculators-format EAGLE-3 checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.drafters.eagle import EagleDrafter, TreeShape, tree_with
from specdec.drafters.medusa import MedusaDrafter
from specdec.errors import InvalidParameterError
from specdec.heads.checkpoint import load_head
from specdec.interop.speculators import is_speculators_checkpoint, load_speculators_head

SHIPPED_HEADS = Path(__file__).resolve().parent.parent / "heads" / "shipped"
# The EAGLE tree a CPU target gets by default: on a CPU a forward's cost grows with its rows, and of the
# shapes measured on smollm2 only this small one broke even (the GPU default of 24 nodes lost clearly).
CPU_TREE = TreeShape(depth=3, top_k=2, budget=4)


def shipped_head(kind: str, target_name: str) -> Path:
    path = SHIPPED_HEADS / f"{target_name}-{kind}"
    if not path.is_dir():
        raise InvalidParameterError(
            f"no {kind} head ships for {target_name!r}; train one with "
            f"`specdec train {kind} --target {target_name} --out DIR` and use --drafter {kind}:DIR")
    return path


def head_drafter(kind: str, spec, target):
    """The EAGLE or Medusa drafter a spec.DrafterSpec names (its argument: a head directory)."""
    options, location = spec.options, spec.argument
    path = Path(location).expanduser() if location else shipped_head(kind, target.name)
    if kind == "eagle":  # specdec's EAGLE and EAGLE-3 heads, or a speculators EAGLE-3 checkpoint
        head = (load_speculators_head(path, target) if is_speculators_checkpoint(path)
                else load_head(path, target, ("eagle", "eagle3")))
    else:
        head = load_head(path, target, (kind,))
    if kind == "eagle":
        defaults = CPU_TREE if target.model.device.type == "cpu" else TreeShape()
        shape = options.shape(defaults)
        return EagleDrafter(head, target.model, shape, name=f"eagle:{path.name}")
    # only budget=N: the tree follows the heads' accuracy
    return MedusaDrafter(head, target.model, options.budget, name=f"medusa:{path.name}")


@dataclass(frozen=True)
class MedusaOptions:
    """medusa[:HEAD_DIR]@budget=N: the tree's nodes a round."""

    budget: int = 16

    def __post_init__(self):
        tree_with(TreeShape(), budget=self.budget)  # the range


def build_eagle(spec, target, device: str, dtype: str) -> EagleDrafter:
    """`eagle[:HEAD_DIR][@depth=D,topk=W,budget=N]`."""
    return head_drafter("eagle", spec, target)


def build_medusa(spec, target, device: str, dtype: str) -> MedusaDrafter:
    """`medusa[:HEAD_DIR][@budget=N]`."""
    return head_drafter("medusa", spec, target)
