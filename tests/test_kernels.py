"""The packed small-row CPU kernel against a float64 reference, across shapes and row counts."""

import pytest
import torch

from specdec.kernels import pack_weight, packed_kernel, packed_matmul, unpack_rows
from specdec.models.packed_linear import PackedLinear

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA CPU or no C++ compiler here")


@pytest.mark.parametrize("in_features,out_features", [(64, 16), (96, 100), (7, 33), (576, 1536), (1536, 257)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 40])  # > 16: the GEMM path
def test_matches_float64_reference(in_features, out_features, rows):
    gen = torch.Generator().manual_seed(in_features * 1000 + rows)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    reference = x.double() @ weight.double().T
    result = packed_matmul(x, pack_weight(weight), out_features)
    # float32 accumulation over in_features terms of size ~1: error grows like sqrt(in) * eps * |terms|
    assert (result.double() - reference).abs().max() < 1e-5 * in_features


def test_row_results_do_not_depend_on_batch_size():
    """Each output is one FMA chain in a fixed order: a row rounds the same alone or among 16."""
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(300, 200, generator=gen), torch.randn(16, 200, generator=gen)
    packed = pack_weight(weight)
    together = packed_matmul(x, packed, 300)
    for row in range(16):
        assert torch.equal(packed_matmul(x[row:row + 1].contiguous(), packed, 300)[0], together[row])


def test_packed_linear_fuses_and_keeps_bias():
    gen = torch.Generator().manual_seed(1)
    layers = [torch.nn.Linear(48, n, bias=b) for n, b in [(32, True), (8, False), (8, True)]]
    fused = PackedLinear.fuse(layers)
    x = torch.randn(2, 3, 48, generator=gen)
    for got, layer in zip(fused(x), layers):
        assert (got - layer(x)).abs().max() < 1e-5


def test_unpack_rows_reads_embeddings():
    weight = torch.randn(37, 24)
    ids = torch.tensor([[0, 15, 16, 36]])
    assert torch.equal(unpack_rows(pack_weight(weight), ids), weight[ids])
