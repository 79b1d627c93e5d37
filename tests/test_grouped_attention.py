"""Masked attention with a KV group's query heads as rows of one head: bit-identical to torch's grouped-query
attention over the same mask, for any batch, dtype and mask (but bfloat16 on CPUs with AMX, below)."""

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels.build import cpu_flags
from specdec.models.grouped_attention import MASK_BYTES, GroupedMask

# torch's bfloat16 CPU attention multiplies on AMX tiles where the CPU has them, blocked by the number of rows,
# so stacking the group's rows moves a rare output element by one bfloat16 step there
BF16_ON_TILES = "amx_bf16" in cpu_flags()


def random_mask(batch: int, rows: int, keys: int, seed: int) -> torch.Tensor:
    """(batch, rows, keys) bool with every row seeing its last key (as every real row sees itself)."""
    mask = torch.rand(batch, rows, keys, generator=torch.Generator().manual_seed(seed)) < 0.7
    mask[:, :, -1] = True
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,heads,kv_heads", [(1, 12, 2), (2, 4, 2), (1, 4, 1)])
def test_grouped_rows_equal_torch_grouped_query_attention(dtype, batch, heads, kv_heads):
    generator = torch.Generator().manual_seed(heads * 10 + batch)
    rows, keys, dim = 40, 300, 64
    q = torch.randn(batch, rows, heads, dim, generator=generator).to(dtype).transpose(1, 2)  # as the model's
    k = torch.randn(batch, kv_heads, keys, dim, generator=generator).to(dtype)
    v = torch.randn(batch, kv_heads, keys, dim, generator=generator).to(dtype)
    mask = random_mask(batch, rows, keys, seed=batch)
    grouped = GroupedMask.of(mask, heads // kv_heads, dtype)
    assert grouped is not None and grouped.additive.shape == (batch, 1, heads // kv_heads * rows, keys)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), enable_gqa=True, scale=0.1)
    got = grouped.attend(q, k, v, 0.1)
    if dtype == torch.bfloat16 and BF16_ON_TILES:
        torch.testing.assert_close(got, expected, rtol=2 ** -7, atol=0)  # one bfloat16 step at most
        assert (got != expected).float().mean() < 1e-3  # and rarely
    else:
        assert torch.equal(got, expected)
    # control: a mask off by one key is seen, far beyond the tolerance above
    shifted = GroupedMask.of(mask.roll(1, dims=2), heads // kv_heads, dtype)
    assert not torch.allclose(shifted.attend(q, k, v, 0.1), expected, rtol=2 ** -7, atol=0)


def test_no_grouping_for_one_head_a_group_or_a_mask_past_its_budget():
    assert GroupedMask.of(torch.ones(1, 4, 8, dtype=torch.bool), 1, torch.float32) is None
    rows = MASK_BYTES // (6 * 4 * 1024) + 1
    assert GroupedMask.of(torch.ones(1, rows, 1024, dtype=torch.bool), 6, torch.float32) is None
    assert GroupedMask.of(torch.ones(1, rows - 2, 1024, dtype=torch.bool), 6, torch.float32) is not None
