"""The integer kernels (grouped 4-bit / 7-bit weights x int8-quantized activations) against a float64 reference."""

import pytest
import torch

from specdec import kernels
from specdec.kernels import ZERO_POINTS, dequantize_grouped, integer_matmul, packed_kernel, quantize_grouped
from specdec.models.quantized.packed_linear import PackedEmbedding, PackedLinear
from kernel_builds import every_build

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA/F16C CPU or no C++ compiler here")


def quantized_activations(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """As the kernels do it, in float32: per block of 32 (Q8_0) or 256 (Q8_K), xq = round(x * 127 / max|x|),
    dx = max|x| / 127. Returns xq (T, K) int64 and dx (T, K/block) float64."""
    blocks = x.view(x.shape[0], -1, block)  # (T, K/block, block)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    inverse = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(blocks * inverse).to(torch.int64)
    return xq.view(x.shape), (amax / torch.tensor(127.0)).squeeze(2).double()


def reference(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """float64: sum over blocks of dw * dx * (exact integer dot product of (q - zero) and xq)."""
    weight = dequantize_grouped(packed, scales, x.shape[1])[:out_features].double()  # (N, K) = dw * (q - zero)
    group = x.shape[1] // scales.shape[1]
    dw = scales.double().transpose(1, 2).reshape(-1, scales.shape[1])[:out_features]  # (N, K/G)
    q = torch.round(weight / dw.repeat_interleave(group, dim=1).where(dw.repeat_interleave(group, 1) != 0,
                                                                        torch.tensor(1.0, dtype=torch.float64)))
    xq, dx = quantized_activations(x)
    rows, cols = x.shape
    products = (xq.view(rows, 1, cols // 32, 32) * q.to(torch.int64).view(1, out_features, cols // 32, 32)).sum(-1)
    block_scale = dx.view(rows, 1, -1) * dw.repeat_interleave(group // 32, dim=1).view(1, out_features, -1)
    return (products.double() * block_scale).sum(-1)  # (T, N)


@pytest.mark.parametrize("in_features,out_features,group", [(64, 16, 32), (96, 100, 32), (128, 33, 64),
                                                            (576, 1536, 32), (1536, 257, 128), (256, 7, 256)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 16, 17, 40])
@pytest.mark.parametrize("bits", [4, 7])
def test_integer_kernel_matches_float64_reference(in_features, out_features, group, rows, bits):
    gen = torch.Generator().manual_seed(in_features * 1000 + rows + group + bits)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    x[0, :32] = 0.0  # an all-zero activation block must not divide by zero
    weight[-1, :] = 0.0  # nor an all-zero weight group
    packed, scales = quantize_grouped(weight, group, bits)
    expected = reference(x, packed, scales, out_features)
    result = integer_matmul(x, packed, scales, out_features)
    # integer sums are exact: only the float32 scale products and the per-block accumulation round
    assert (result.double() - expected).abs().max() < 1e-5 * expected.abs().max() + 1e-6


@pytest.mark.parametrize("rows", [1, 3, 4, 8, 13])
@pytest.mark.parametrize("bits", [4, 7])
def test_avx512_build_is_bit_identical_to_the_avx2_build(rows, bits):
    """vpdpbusd gives the same exact integer sums as vpmaddubsw + vpmaddwd: not one bit may differ."""
    gen = torch.Generator().manual_seed(rows * 10 + bits)
    weight, x = torch.randn(70, 512, generator=gen), torch.randn(rows, 512, generator=gen) * 3
    packed, scales = quantize_grouped(weight, 64, bits)
    results = []
    for library in every_build():
        with kernels.using_kernel(library):
            results.append(integer_matmul(x, packed, scales, 70))
    assert all(torch.equal(results[0], result) for result in results[1:])


@pytest.mark.parametrize("bits,low,high", [(4, 0.05, 0.15), (7, 0.003, 0.02)])
def test_integer_kernel_is_close_to_the_float_product(bits, low, high):
    """Quantizing both operands costs accuracy, boundedly (relative error of 1536-input products)."""
    gen = torch.Generator().manual_seed(9)
    weight, x = torch.randn(64, 1536, generator=gen), torch.randn(4, 1536, generator=gen)
    packed, scales = quantize_grouped(weight, 32, bits)
    exact = x.double() @ weight.double().T
    error = (integer_matmul(x, packed, scales, 64).double() - exact).norm() / exact.norm()
    assert low < error < high  # lossy, by the amount the bit width predicts


def test_int4_quantization_round_trip():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(20, 128, generator=gen)
    weight[5, 32:64] = 0.0  # an all-zero group
    packed, scales = quantize_grouped(weight, 32, 4)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 16, 32) and scales.shape == (3, 4, 8)
    restored = dequantize_grouped(packed, scales, 128)[:20]
    step = scales.float().transpose(1, 2).reshape(-1, 4)[:20].abs().repeat_interleave(32, dim=1)  # (N, K)
    error, slack = (restored - weight).abs(), 1e-3 * step + 1e-7
    # half a step, except for values beyond 7.5 steps on the side opposite the extreme (-8..7 is asymmetric)
    assert torch.all(error <= torch.where(weight.abs() <= 7.5 * step, step / 2, step) + slack)
    assert torch.all(restored[5, 32:64] == 0)
    # the largest magnitude of each group is represented exactly (up to the float16 scale)
    groups = weight.view(20, 4, 32)
    extreme = groups.gather(2, groups.abs().argmax(2, keepdim=True))
    assert torch.allclose(restored.view(20, 4, 32).gather(2, groups.abs().argmax(2, keepdim=True)), extreme,
                          rtol=1e-3)
    rows = torch.tensor([[0, 19], [8, 7]])
    assert torch.equal(dequantize_grouped(packed, scales, 128, rows), dequantize_grouped(packed, scales, 128)[rows])


def test_int7_quantization_round_trip():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(20, 128, generator=gen)
    packed, scales = quantize_grouped(weight, 64, 7)
    assert packed.shape == (3, 32, 32) and scales.shape == (3, 2, 8) and packed.max() <= 127
    restored = dequantize_grouped(packed, scales, 128)[:20]
    step = scales.float().transpose(1, 2).reshape(-1, 2)[:20].repeat_interleave(64, dim=1)  # (N, K)
    assert torch.all((restored - weight).abs() <= step / 2 + 1e-3 * step)
    assert ZERO_POINTS[7] == 64 and torch.all((packed.int() - 64).abs() <= 63)


@pytest.mark.parametrize("bits", [4, 7])
def test_integer_rows_do_not_depend_on_batch_size(bits):
    """Each row is quantized and accumulated on its own: a row's output is bit-identical alone or among 40."""
    gen = torch.Generator().manual_seed(4)
    weight, x = torch.randn(300, 256, generator=gen), torch.randn(40, 256, generator=gen)
    packed, scales = quantize_grouped(weight, 64, bits)
    together = integer_matmul(x, packed, scales, 300)
    for row in range(40):
        assert torch.equal(integer_matmul(x[row:row + 1].contiguous(), packed, scales, 300)[0], together[row])


def test_int4_packed_linear_formats_and_tied_embedding_rows():
    gen = torch.Generator().manual_seed(5)
    layer = torch.nn.Linear(64, 40, bias=True)
    packed = PackedLinear.fuse([layer])
    copy = packed.quantized_copy("int4:64")
    assert packed.weight_format == "float32" and copy.weight_format == "int4:64"
    assert packed.quantized_copy("int4").weight_format == "int4"
    x = torch.randn(3, 64, generator=gen)
    assert (copy(x) - layer(x)).abs().max() < 0.2 * layer(x).abs().max()
    with pytest.raises(ValueError, match="cannot be turned into"):
        copy.quantized_copy("int8")
    with pytest.raises(ValueError, match="dividing the layer's 64 inputs"):
        packed.quantized_copy("int4:128")
    ids = torch.tensor([[0, 17, 39]])
    assert torch.equal(PackedEmbedding(copy)(ids), dequantize_grouped(copy.packed, copy.scales, 64)[ids])
    int7 = packed.quantized_copy("int7")
    assert int7.weight_format == "int7" and (int7(x) - layer(x)).abs().max() < 0.02 * layer(x).abs().max()
