"""The packed small-row CPU kernel against a float64 reference, across shapes and row counts."""

import pytest
import torch

from specdec import kernels
from specdec.kernels import (
    pack_weight,
    packed_kernel,
    packed_matmul,
    packed_matmul_int8,
    quantize_packed_int8,
    unpack_rows,
)
from specdec.models.quantized.packed_linear import PackedLinear
from kernel_builds import every_build

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA CPU or no C++ compiler here")


@pytest.mark.parametrize("in_features,out_features", [(64, 16), (96, 100), (7, 33), (576, 1536), (1536, 257)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 40, 70, 301])  # > 64: prefill sizes
def test_matches_float64_reference(in_features, out_features, rows):
    gen = torch.Generator().manual_seed(in_features * 1000 + rows)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    reference = x.double() @ weight.double().T
    result = packed_matmul(x, pack_weight(weight), out_features)
    # float32 accumulation over in_features terms of size ~1: error grows like sqrt(in) * eps * |terms|
    assert (result.double() - reference).abs().max() < 1e-5 * in_features


def test_row_results_do_not_depend_on_batch_size():
    """Each output is one FMA chain in a fixed order: a row rounds the same alone or among up to 16
    (every row count: each splits into row blocks differently)."""
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(300, 200, generator=gen), torch.randn(16, 200, generator=gen)
    packed = pack_weight(weight)
    alone = torch.cat([packed_matmul(x[row:row + 1].contiguous(), packed, 300) for row in range(16)])
    for rows in range(2, 17):
        assert torch.equal(packed_matmul(x[:rows].contiguous(), packed, 300), alone[:rows])


@pytest.mark.parametrize("rows", [1, 3, 5, 8, 9, 12, 13, 17, 70])
@pytest.mark.parametrize("int8", [False, True])
def test_avx512_build_is_bit_identical_to_the_avx2_build(rows, int8):
    """Blocks of up to 12 rows (AVX-512's registers) keep each output's one FMA chain: not one bit differs."""
    gen = torch.Generator().manual_seed(rows)
    packed, x = pack_weight(torch.randn(100, 320, generator=gen)), torch.randn(rows, 320, generator=gen)
    results = []
    for library in every_build():
        with kernels.using_kernel(library):
            if int8:
                quantized, scales = quantize_packed_int8(packed)
                results.append(packed_matmul_int8(x, quantized, scales, 100))
            else:
                results.append(packed_matmul(x, packed, 100))
    assert all(torch.equal(results[0], result) for result in results[1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17, 70])
def test_half_panels_compute_what_float32_panels_of_their_values_compute(dtype, rows):
    """bf16 / fp16 panels are widened to float32 in registers (exactly: float32 holds every such value), so each
    output is the float32 kernel's on the same values, bit for bit, in either build and at any row count."""
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(100, 320, generator=gen).to(dtype), torch.randn(rows, 320, generator=gen)
    for library in every_build():
        with kernels.using_kernel(library):
            half = packed_matmul(x, pack_weight(weight).to(dtype), 100)
            assert torch.equal(half, packed_matmul(x, pack_weight(weight.float()), 100))
    assert torch.equal(unpack_rows(pack_weight(weight).to(dtype), torch.tensor([3, 99])), weight[[3, 99]].float())


def test_a_compiler_without_the_avx512_flags_keeps_the_avx2_build(capsys):
    library = kernels.choose_kernel([tuple(kernels.FLAGS + ["-mno-such-option"]), tuple(kernels.FLAGS)])
    assert library is kernels.build_kernel(tuple(kernels.FLAGS))
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(kernels.KernelBuildError, match="no-such-option"):
        kernels.build_kernel(tuple(kernels.FLAGS + ["-mno-such-option"]))


def test_a_kernel_that_cannot_be_built_leaves_torch_with_a_one_line_warning(capsys):
    assert kernels.choose_kernel([tuple(kernels.FLAGS + ["-mno-such-option"])]) is None
    warning = capsys.readouterr().err
    assert warning.startswith("specdec: warning: could not build the CPU kernel") and "no-such-option" in warning


def test_using_kernel_selects_a_build_inside_the_block_only():
    default = kernels.packed_kernel()
    other = kernels.build_kernel(tuple(kernels.FLAGS))
    with kernels.using_kernel(other):
        assert kernels.packed_kernel() is other
        with kernels.using_kernel(None):
            assert kernels.packed_kernel() is None
        assert kernels.packed_kernel() is other
    assert kernels.packed_kernel() is default


def test_a_source_directory_is_built_from_its_own_files(tmp_path):
    """build_kernel(flags, directory) reads that directory's sources (a variant to compare); the build is keyed
    by their content, so an unchanged copy reuses the committed sources' library file."""
    import shutil
    from pathlib import Path

    for name in kernels.source_names() + kernels.HEADER_NAMES:
        shutil.copy(kernels.KERNEL_DIR / name, tmp_path / name)
    flags = tuple(kernels.FLAGS)
    copy = kernels.build_kernel(flags, tmp_path)
    committed = kernels.build_kernel(flags)
    assert copy is not committed and Path(copy._name).name == Path(committed._name).name
    (tmp_path / "layer_ops.cpp").unlink()
    with pytest.raises(FileNotFoundError):
        kernels.build_kernel.__wrapped__(flags, tmp_path)


def test_prefill_rows_round_as_decode_rows():
    """Prefill takes the same kernel: a prompt's rows are bit-identical to one-row steps."""
    gen = torch.Generator().manual_seed(1)
    weight, x = torch.randn(100, 256, generator=gen), torch.randn(200, 256, generator=gen)
    packed = pack_weight(weight)
    together = packed_matmul(x, packed, 100)
    for row in (0, 63, 64, 65, 150, 199):
        assert torch.equal(packed_matmul(x[row:row + 1].contiguous(), packed, 100)[0], together[row])


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


def dequantized(quantized: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """int8 panels (P, K, 16) + scales -> the (N, K) float64 matrix they stand for."""
    panels, cols, _ = quantized.shape
    rows = quantized.double().transpose(1, 2).reshape(panels * 16, cols)
    return (rows * scales.double()[:, None])[:out_features]


@pytest.mark.parametrize("in_features,out_features", [(64, 16), (96, 100), (7, 33), (576, 1536), (1536, 257)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 40])
def test_int8_kernel_matches_float64_reference_of_the_dequantized_weights(in_features, out_features, rows):
    gen = torch.Generator().manual_seed(in_features * 1000 + rows + 7)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    quantized, scales = quantize_packed_int8(pack_weight(weight))
    reference = x.double() @ dequantized(quantized, scales, out_features).T
    result = packed_matmul_int8(x, quantized, scales, out_features)
    assert (result.double() - reference).abs().max() < 1e-5 * in_features


def test_int8_quantization_error_is_within_half_a_step():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(50, 80, generator=gen)
    weight[7] = 0.0  # an all-zero column must not divide by zero
    quantized, scales = quantize_packed_int8(pack_weight(weight))
    assert quantized.dtype == torch.int8 and quantized.abs().max() <= 127
    error = (dequantized(quantized, scales, 50) - weight.double()).abs()
    assert torch.all(error <= scales.double()[:50, None] / 2 + 1e-7)
    assert torch.all(dequantized(quantized, scales, 50)[7] == 0)


def test_int8_rows_do_not_depend_on_batch_size():
    gen = torch.Generator().manual_seed(4)
    weight, x = torch.randn(300, 200, generator=gen), torch.randn(16, 200, generator=gen)
    quantized, scales = quantize_packed_int8(pack_weight(weight))
    alone = torch.cat([packed_matmul_int8(x[row:row + 1].contiguous(), quantized, scales, 300) for row in range(16)])
    for rows in range(2, 17):
        assert torch.equal(packed_matmul_int8(x[:rows].contiguous(), quantized, scales, 300), alone[:rows])


def test_int8_packed_linear_and_tied_embedding_rows():
    gen = torch.Generator().manual_seed(5)
    layer = torch.nn.Linear(48, 40, bias=True)
    packed = PackedLinear.fuse([layer])
    copy = packed.quantized_copy("int8")
    assert packed.weight_format == "float32" and copy.weight_format == "int8"  # the original is untouched
    x = torch.randn(3, 48, generator=gen)
    assert (copy(x) - layer(x)).abs().max() < 0.05  # int8 is close to float32 ...
    assert not torch.equal(copy(x), packed(x))  # ... but not the same
    ids = torch.tensor([[0, 17, 39]])
    rows = unpack_rows(copy.packed, ids, copy.scales)
    assert torch.allclose(rows.double(), dequantized(copy.packed, copy.scales, 40)[ids], atol=1e-6)


def attention_case(heads: int, kv_heads: int, dim: int, rows: int, prefix: int, seed: int):
    """q (1, H, T, D); strided views of a cache's keys and values (1, Hkv, prefix + T, D), as the cache's
    layer slices are; a visible mask (T, T) of chain and tree rows (each sees itself, some earlier rows)."""
    gen = torch.Generator().manual_seed(seed)
    capacity = prefix + rows + 29
    q = torch.randn(1, heads, rows, dim, generator=gen)
    cache_k = torch.randn(1, kv_heads, capacity, dim, generator=gen)
    cache_v = torch.randn(1, kv_heads, capacity, dim, generator=gen)
    visible = torch.eye(rows, dtype=torch.bool) | (torch.rand(rows, rows, generator=gen) < 0.5).tril()
    visible[:rows // 2, :2] = visible[:rows // 2, :2].tril()  # the first rows of a chunk share their first keys
    return q, cache_k[:, :, :prefix + rows], cache_v[:, :, :prefix + rows], visible


# (12, 2, 128) and 40 rows over 70 cached keys: several key and value blocks, two row chunks (attention.cpp);
# a KV head's query rows 6 at a time sharing key and value loads (AVX-512), then the leftover 1 to 5 together:
# 7 (14 on 2), 5 (10 on 2), 9 (9 on 3, 3 rows), 16 (4 on 2, 8 rows), 8 (6 on 6, 8 rows)
@pytest.mark.parametrize("heads,kv_heads,dim,rows,prefix", [
    (4, 2, 16, 1, 11), (4, 2, 16, 8, 11), (9, 3, 64, 3, 11), (6, 6, 20, 8, 11), (12, 2, 128, 1, 11), (14, 2, 64, 1, 11),
    (10, 2, 64, 1, 11),
    (12, 2, 128, 8, 11), (2, 1, 100, 3, 11), (12, 2, 128, 40, 70), (4, 2, 20, 40, 70)])
def test_attention_rows_match_float64_reference_and_single_rows(heads, kv_heads, dim, rows, prefix):
    """Each row attends to the cached prefix and the new keys its mask shows (chain or tree rows), GQA
    included; a row's output is bit-identical when it is computed alone, and in every build of the kernels."""
    from specdec.kernels import attention_rows

    q, keys, values, visible = attention_case(heads, kv_heads, dim, rows, prefix, heads * 100 + rows)
    out = attention_rows(q, keys, values, visible.to(torch.uint8), prefix)  # (1, T, H * D)
    group = heads // kv_heads
    for t in range(rows):
        seen = torch.cat([torch.arange(prefix), prefix + visible[t].nonzero().squeeze(1)])
        k, v = keys[0, :, seen].double(), values[0, :, seen].double()  # (Hkv, n, D)
        for h in range(heads):
            weights = torch.softmax(k[h // group] @ q[0, h, t].double() / dim ** 0.5, dim=0)
            assert torch.allclose(out[0, t, h * dim:(h + 1) * dim].double(), weights @ v[h // group], atol=1e-5)
        # each row as the only row of its call (rows share key loads, chunks share keys): the same bits
        single = attention_rows(q[:, :, t:t + 1], keys, values, visible[t:t + 1].to(torch.uint8), prefix)
        assert torch.equal(single[0, 0], out[0, t])
        if bool(visible[t, :t + 1].all()):  # a chain row: alone, a one-token step over prefix + t + 1 keys
            one = torch.ones(1, 1, dtype=torch.uint8)
            alone = attention_rows(q[:, :, t:t + 1], keys[:, :, :prefix + t + 1], values[:, :, :prefix + t + 1],
                                   one, prefix + t)
            assert torch.equal(alone[0, 0], out[0, t])
    for library in every_build():  # AVX-512 builds take wider tiles: the same arithmetic per row and column
        with kernels.using_kernel(library):
            assert torch.equal(attention_rows(q, keys, values, visible.to(torch.uint8), prefix), out)


# (12, 2, 128): 6 query rows a tile (AVX-512), 4 key blocks of 32 over 100 cached keys; (14, 2, 64) 7 a group
# (a tile of 6, then 1), blocks past some rows' last keys; (9, 3, 16): D under one value slice; (4, 1, 24) 3 slices
# of 8; no cached keys at all (start 0)
@pytest.mark.parametrize("heads,kv_heads,dim,rows,start", [
    (12, 2, 128, 40, 100), (14, 2, 64, 37, 61), (9, 3, 16, 9, 33), (4, 1, 24, 12, 0)])
def test_attention_block_matches_float64_reference_whatever_rows_share_its_call(heads, kv_heads, dim, rows, start):
    """A prefill block's row t attends to keys [0, start + t] (sinks included); each row's bits do not depend on
    which rows share its call (each row alone, the block split in two), on the build, or on a two-byte cache
    read directly rather than widened first. Keys past the block (never written) are NaN: never read."""
    from specdec.kernels import attention_block

    gen = torch.Generator().manual_seed(heads * 100 + rows)
    q = torch.randn(1, heads, rows, dim, generator=gen)
    keys, values = (torch.randn(1, kv_heads, start + rows + 5, dim, generator=gen) for _ in range(2))
    keys[:, :, start + rows:], values[:, :, start + rows:] = float("nan"), float("nan")
    sinks = torch.randn(heads, generator=gen)
    group = heads // kv_heads
    for with_sinks in (None, sinks):
        out = attention_block(q, keys, values, start, sinks=with_sinks)  # (1, T, H * D)
        for t in range(rows):
            k, v = keys[0, :, :start + t + 1].double(), values[0, :, :start + t + 1].double()
            for h in range(heads):
                scores = k[h // group] @ q[0, h, t].double() / dim ** 0.5
                if with_sinks is not None:
                    scores = torch.cat([scores, with_sinks[h:h + 1].double()])
                weights = torch.softmax(scores, dim=0)[:start + t + 1]
                assert torch.allclose(out[0, t, h * dim:(h + 1) * dim].double(), weights @ v[h // group], atol=1e-5)
    out = attention_block(q, keys, values, start)
    alone = torch.cat([attention_block(q[:, :, t:t + 1], keys, values, start + t) for t in range(rows)], dim=1)
    half = rows // 2
    split = torch.cat([attention_block(q[:, :, :half], keys, values, start),
                       attention_block(q[:, :, half:], keys, values, start + half)], dim=1)
    assert torch.equal(alone, out) and torch.equal(split, out)
    short_keys, short_values = keys.bfloat16(), values.bfloat16()
    wide = attention_block(q, short_keys.float(), short_values.float(), start)
    for library in every_build():  # only 8-lane arithmetic: AVX-512's wider tiles change no bit
        with kernels.using_kernel(library):
            assert torch.equal(attention_block(q, keys, values, start), out)
            assert torch.equal(attention_block(q, short_keys, short_values, start), wide)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_two_byte_kv_cache_is_read_and_written_as_torch_rounds_it(dtype):
    """Attention over a bf16/fp16 cache computes, bit for bit, what it computes over a float32 cache holding
    the same (rounded) values, in every build; the kernel's cache writes round as torch's conversion does."""
    from specdec.kernels import attention_rows, rope_qkv_to_cache

    q, keys, values, visible = attention_case(12, 2, 128, 8, 40, seed=3)
    keys, values = keys * 30, values * 30  # some values past float16's subnormal and rounding edges
    short_keys, short_values = keys.to(dtype), values.to(dtype)
    for library in every_build():
        with kernels.using_kernel(library):
            wide = attention_rows(q, short_keys.float(), short_values.float(), visible.to(torch.uint8), 40)
            assert torch.equal(attention_rows(q, short_keys, short_values, visible.to(torch.uint8), 40), wide)
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(1, 3, (4 + 2 * 2) * 16, generator=gen) * torch.tensor([1e-6, 1.0, 7e4]).view(1, 3, 1)
    angles = torch.randn(1, 1, 3, 16, generator=gen)
    caches = {kind: (torch.zeros(2, 9, 16, dtype=kind), torch.zeros(2, 9, 16, dtype=kind))
              for kind in (torch.float32, dtype)}
    for key_cache, value_cache in caches.values():
        rope_qkv_to_cache(qkv, angles.cos(), angles.sin(), key_cache, value_cache, 4, 2, 5)
    for wide, short in zip(caches[torch.float32], caches[dtype]):
        assert torch.equal(short, wide.to(dtype))


def test_amd_cpus_build_with_prefetches_into_l2(monkeypatch):
    """The build flags follow /proc/cpuinfo's vendor: AMD gets the L2 prefetch hint, Intel keeps L1."""
    from specdec.kernels import build

    monkeypatch.setattr(build, "cpu_has_avx2_fma_f16c", lambda: True)
    monkeypatch.setattr(build, "cpu_vendor", lambda: "AuthenticAMD")
    assert all("-DSPECDEC_PREFETCH_TO_L2" in flags for flags in build.default_builds())
    monkeypatch.setattr(build, "cpu_vendor", lambda: "GenuineIntel")
    assert not any("-DSPECDEC_PREFETCH_TO_L2" in flags for flags in build.default_builds())


def test_cpus_with_amx_try_a_tile_build_first(monkeypatch):
    """With AMX (and AVX512-VNNI) the tile build comes first, the AVX-512 and AVX2 builds after it (a compiler
    without the AMX flags falls back); SPECDEC_NO_AMX=1 or a CPU without AMX leaves it out."""
    from specdec.kernels import build

    monkeypatch.setattr(build, "cpu_has_avx2_fma_f16c", lambda: True)
    monkeypatch.setattr(build, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(build, "cpu_flags", lambda: build.AVX512_CPU_FLAGS | build.AMX_CPU_FLAGS)
    monkeypatch.delenv("SPECDEC_NO_AVX512", raising=False)
    monkeypatch.delenv("SPECDEC_NO_AMX", raising=False)
    builds = build.default_builds()
    assert [("-mamx-int8" in flags, "-mavx512vnni" in flags) for flags in builds] == [(True, True), (False, True),
                                                                                    (False, False)]
    monkeypatch.setenv("SPECDEC_NO_AMX", "1")
    assert not any("-mamx-int8" in flags for flags in build.default_builds())
    monkeypatch.delenv("SPECDEC_NO_AMX")
    monkeypatch.setattr(build, "cpu_flags", lambda: set(build.AVX512_CPU_FLAGS))
    assert len(build.default_builds()) == 2
