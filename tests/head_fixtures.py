"""Random (untrained) EAGLE and Medusa heads for tiny native targets: drafting quality is poor, which
is what exactness tests want (many rejections, deep and shallow accepted paths)."""

from __future__ import annotations

import torch

from specdec.drafters.eagle import EagleDrafter, TreeShape
from specdec.drafters.medusa import MedusaDrafter
from specdec.heads.checkpoint import HeadInfo, LoadedHead
from specdec.heads.eagle import EagleHead, EagleShape
from specdec.heads.medusa import MedusaHeads, MedusaShape


def random_eagle(model, seed: int = 0, vocab: torch.Tensor | None = None) -> LoadedHead:
    torch.manual_seed(seed)
    head = EagleHead(model.config, EagleShape(model.config.intermediate_size)).eval()
    vocab = torch.arange(model.vocab_size) if vocab is None else vocab
    return LoadedHead(HeadInfo("eagle"), head.to(model.device), vocab)


def random_medusa(model, num_heads: int = 3, seed: int = 0) -> LoadedHead:
    torch.manual_seed(seed)
    heads = MedusaHeads(model.hidden_size, MedusaShape(num_heads))
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.normal_(0, 0.5)
    return LoadedHead(HeadInfo("medusa"), heads.eval().to(model.device), torch.arange(model.vocab_size))


def eagle_drafter(model, shape: TreeShape = TreeShape(depth=4, top_k=3, budget=10), seed: int = 0,
                  vocab: torch.Tensor | None = None) -> EagleDrafter:
    return EagleDrafter(random_eagle(model, seed, vocab), model, shape, "eagle:random")


def medusa_drafter(model, budget: int = 8, seed: int = 0) -> MedusaDrafter:
    return MedusaDrafter(random_medusa(model, seed=seed), model, budget, "medusa:random")
