"""`--weights gguf`: a GGUF file's quantized blocks read as they are (models/quantized/gguf_blocks.py), multiplied by
kernels/gguf_matmul.cpp, loaded as a model's layers (models/quantized/gguf_linear.py)."""

import gguf
import numpy as np
import pytest
import torch

from specdec import kernels
from specdec.drafters import make_drafter
from specdec.errors import InvalidParameterError, UnsupportedModelError
from specdec.api.generator import SpeculativeGenerator
from specdec.heads.target_parts import lm_head_rows
from specdec.kernels import packed_kernel
from specdec.models.base import positions_after
from specdec.models.derived import head_prefix_copy
from specdec.models.quantized.gguf_blocks import BlockWeights, code_values, concatenate, decode
from specdec.models.quantized import gguf_matrices
from specdec.models.quantized.gguf_linear import GgufLinear
from specdec.models.sources.loading import load_model
from specdec.models.quantized.packed_cache import packed_cache_path
from kernel_builds import every_build
from test_integer_kernel import quantized_activations
from tiny_models import make_hf_model, random_k_blocks, save_tiny_model, write_tiny_gguf

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA/F16C CPU or no C++ compiler here")

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")  # gguf-py quantizes to these
FORMATS = LEGACY + ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
LAYOUT = {"Q8_0": "signed", "MXFP4": "fp4", "Q5_0": "sixbits", "Q5_1": "sixbits", "Q5_K": "sixbits", "Q6_K": "sixbits",
          "IQ4_NL": "iq4", "IQ4_XS": "iq4", "Q2_K": "crumbs"}  # the rest: nibbles


def blocks_of(format_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """A (rows, cols) matrix in `format_name` as a GGUF file stores it: (rows, bytes per row) uint8."""
    if format_name in LEGACY:
        weight = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
        weight[0, :32] = 0.0  # an all-zero block
        return gguf.quants.quantize(weight, gguf.GGMLQuantizationType[format_name])
    return random_k_blocks(format_name, rows, cols, seed)


def gguf_reference(raw: np.ndarray, format_name: str, rows: int, cols: int) -> torch.Tensor:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[format_name])
    return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(rows, cols))


@pytest.mark.parametrize("format_name", FORMATS)
def test_blocks_decode_to_the_values_gguf_dequantizes_to(format_name):
    raw = blocks_of(format_name, 24, 512, seed=1)
    weights = decode(raw, format_name, 24, 512)
    expected = gguf_reference(raw, format_name, 24, 512)
    assert torch.equal(weights.dequantize(), expected)  # equal values (zeros may differ in sign only)
    assert weights.layout == LAYOUT.get(format_name, "nibbles")
    if weights.layout != "signed":  # each layout's bits hold its codes (and the kernel's 16-bit partial sums)
        assert weights.codes.max() < {"sixbits": 64, "crumbs": 4}.get(weights.layout, 16)
    rows = torch.tensor([[3, 0], [23, 7]])
    assert torch.equal(weights.dequantize(rows), expected[rows])


def test_mxfp4_scales_beyond_float16_are_exact_or_refused():
    """MXFP4's e8m0 scales span 2^-128..2^127: within float16 they are d; up to 2^21 d and a power-of-two sc;
    below 2^-24 only an all-zero block, whose scale does not matter; beyond, a clear refusal."""
    def block(exponent: int, codes: int) -> np.ndarray:
        return np.array([[exponent] + [codes] * 16], dtype=np.uint8)  # 16 bytes: two 4-bit indices each

    for exponent, codes in ((128 + 15, 0x21), (128 + 17, 0x7F), (128 + 21, 0xF9), (128 - 24, 0x33), (3, 0x00)):
        raw = block(exponent, codes)
        assert torch.equal(decode(raw, "MXFP4", 1, 32).dequantize(), gguf_reference(raw, "MXFP4", 1, 32))
    for exponent in (128 + 22, 128 - 25):
        with pytest.raises(ValueError, match="MXFP4 block scale"):
            decode(block(exponent, 0x11), "MXFP4", 1, 32)


def test_unsupported_block_formats_are_refused():
    raw = np.zeros((8, 66), np.uint8)
    with pytest.raises(ValueError, match="IQ2_XXS is not supported"):
        decode(raw, "IQ2_XXS", 8, 256)


def reference(x: torch.Tensor, weights: BlockWeights) -> torch.Tensor:
    """float64: per super-block, dx * sum over its groups of (d sc) * (exact integer sum of q xq) + (dmin mn) * (sum
    of xq), the activations quantized per super-block (32 inputs: Q8_0; 256: Q8_K)."""
    rows, cols = x.shape
    group, per_super = weights.group, weights.super_group // weights.group
    xq, dx = quantized_activations(x, weights.super_group)  # (T, K) int64, (T, K/S)
    codes = code_values(weights.codes, weights.layout).to(torch.int64)  # (N, K)
    scale = weights.d.double().repeat_interleave(per_super, 1) * weights.sc.double()  # (N, K/G)
    minimum = weights.dmin.double().repeat_interleave(per_super, 1) * weights.mn.double()
    products = (xq.view(rows, 1, -1, group) * codes.view(1, -1, cols // group, group)).sum(-1)  # (T, N, K/G)
    sums = xq.view(rows, 1, -1, group).sum(-1)  # (T, 1, K/G)
    row_scale = dx.repeat_interleave(per_super, dim=1).view(rows, 1, -1)  # dx per group
    return ((products.double() * scale + sums.double() * minimum) * row_scale).sum(-1)  # (T, N)


@pytest.mark.parametrize("format_name", FORMATS)
@pytest.mark.parametrize("rows", [1, 5, 8, 17])  # one row; a partial, a full row block; several blocks
def test_block_kernel_matches_float64_reference(format_name, rows):
    out_features, in_features = 44, 512  # 44: a partial column block
    weights = decode(blocks_of(format_name, out_features, in_features, seed=rows), format_name, out_features,
                     in_features)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=gen)
    x[0, 32:64] = 0.0  # an all-zero activation block
    layer = GgufLinear(weights, None, [out_features])
    expected = reference(x, weights)
    # integer sums are exact: only the float32 scale products and the accumulation round
    assert (layer(x).double() - expected).abs().max() < 1e-5 * expected.abs().max() + 1e-6
    # and the activation quantization costs little against the exact product with the file's weights
    exact = x.double() @ weights.dequantize().double().T
    assert (layer(x).double() - exact).norm() / exact.norm() < 0.02


@pytest.mark.parametrize("format_name", FORMATS)
@pytest.mark.parametrize("rows", [1, 12, 37])  # 37: two tiles of 16 rows (AMX) and 5 rows past them
def test_every_kernel_build_gives_the_same_bits(format_name, rows):  # AVX2, AVX-512, AVX-512 + AMX tiles
    weights = decode(blocks_of(format_name, 44, 512, seed=rows), format_name, 44, 512)
    layer = GgufLinear(weights, None, [44])
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)) * 3
    results = []
    for library in every_build():
        with kernels.using_kernel(library):
            results.append(layer(x))
    assert all(torch.equal(results[0], result) for result in results[1:])


@pytest.mark.parametrize("format_name", ["Q3_K", "Q4_K", "Q6_K", "Q8_0", "IQ4_XS"])
def test_block_rows_do_not_depend_on_batch_size(format_name):
    weights = decode(blocks_of(format_name, 40, 256, seed=3), format_name, 40, 256)
    layer = GgufLinear(weights, torch.randn(40), [40])
    x = torch.randn(36, 256, generator=torch.Generator().manual_seed(2))  # 36: past the tiles' (AMX) threshold
    together = layer(x)
    for row in range(36):
        assert torch.equal(layer(x[row:row + 1])[0], together[row])


def test_fused_matrices_of_different_formats_keep_every_value():
    """q and k in Q4_K with v in Q6_K (as llama.cpp's Q4_K_M mixes) fuse into one matrix of a common form."""
    parts = [decode(blocks_of(name, rows, 256, seed=rows), name, rows, 256)
             for name, rows in (("Q4_K", 16), ("Q4_K", 8), ("Q6_K", 8))]
    fused = concatenate(parts)
    assert (fused.layout, fused.group, fused.super_group) == ("sixbits", 16, 256)
    expected = torch.cat([p.dequantize() for p in parts])
    assert torch.equal(fused.dequantize(), expected)
    layer = GgufLinear(fused, None, [16, 8, 8])
    ids = torch.tensor([[0, 17, 31]])
    assert torch.equal(layer.embedding_rows(ids), expected[ids])
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1))
    outputs = layer(x)
    assert [o.shape for o in outputs] == [(2, 16), (2, 8), (2, 8)]
    exact = x.double() @ expected.double().T
    assert (torch.cat(outputs, -1).double() - exact).norm() / exact.norm() < 0.02
    q8 = decode(blocks_of("Q8_0", 8, 256, seed=9), "Q8_0", 8, 256)
    signed = concatenate([parts[0], q8])
    assert signed.layout == "signed"
    assert torch.equal(signed.dequantize(), torch.cat([parts[0].dequantize(), q8.dequantize()]))


def test_q2_k_codes_stay_two_bits_and_widen_when_fused():
    """Q2_K alone keeps its 2-bit codes (16 bytes a step of 8 inputs x 8 columns); fused with Q3_K (as
    llama.cpp's Q2_K preset mixes q, k and v) the codes widen to 4 bits; both read back every value."""
    alone = decode(blocks_of("Q2_K", 16, 512, seed=3), "Q2_K", 16, 512)
    layer = GgufLinear(alone, None, [16])
    assert alone.layout == "crumbs" and layer.packed.shape == (2, 512 // 8, 16)
    ids = torch.tensor([[0, 5, 9, 15]])
    assert torch.equal(layer.embedding_rows(ids), alone.dequantize()[ids])
    fused = concatenate([alone, decode(blocks_of("Q3_K", 8, 512, seed=4), "Q3_K", 8, 512)])
    assert fused.layout == "nibbles"
    assert torch.equal(GgufLinear(fused, None, [16, 8]).embedding_rows(ids), fused.dequantize()[ids])


TOKENS = torch.tensor([[5, 17, 42, 99, 3, 7, 120, 64]])


def logits(model) -> torch.Tensor:
    return model.forward(TOKENS, positions_after(0, TOKENS.shape[1], 1, "cpu"), model.new_cache(1, 64)).logits


@pytest.mark.parametrize("kind,quantization", [
    ("llama", "Q4_0"),  # tied embeddings (the LM head's blocks), llama.cpp's q/k row order
    ("qwen2", {"default": "Q8_0", "ffn_down.weight": "Q4_1", "attn_v.weight": "Q5_0"}),
    ("llama-untied", {"default": "Q4_K", "attn_v.weight": "Q6_K", "output.weight": "Q6_K"}),  # as Q4_K_M
    # the low-bit K-quants and an i-quant head and o_proj ("output.weight" matches attn_output.weight too)
    ("llama-untied", {"default": "Q3_K", "attn_v.weight": "Q5_K", "ffn_down.weight": "Q2_K",
                      "output.weight": "IQ4_XS"}),
    ("qwen2", {"default": "IQ4_NL", "ffn_down.weight": "Q5_1", "attn_v.weight": "Q8_0"}),  # as IQ4_NL: i-quant + legacy
    ("qwen3", "Q8_0"),  # query/key norms, heads wider than hidden / heads
    ("gemma3", {"default": "Q5_0", "attn_v.weight": "Q8_0"}),  # as the 270M file: sliding window, (1 + w) norms
    ("phi3", {"default": "Q8_0", "ffn_up.weight": "Q4_1"}),  # fused q/k/v and gate/up as stored, partial rotary
    ("qwen3_moe", {"default": "Q8_0", "ffn_down_exps.weight": "Q5_0", "ffn_gate_inp.weight": "F32"}),  # experts
    # as llama.cpp's gpt-oss files: MXFP4 experts (with F32 biases), the rest Q8_0; sinks, a window crossed
    ("gpt_oss", {"default": "Q8_0", "_exps.weight": "MXFP4"}),
])
def test_a_gguf_model_runs_on_its_own_blocks(tmp_path, kind, quantization):
    if kind == "llama-untied":  # K-quants need 256 inputs
        hf = make_hf_model("llama", seed=5, hidden_size=256, intermediate_size=512, tie_word_embeddings=False)
    elif kind == "qwen3_moe":  # every layer a mixture, as llama.cpp's files
        hf = make_hf_model(kind, seed=5, mlp_only_layers=[])
    else:
        hf = make_hf_model(kind, seed=5)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, quantization)
    dequantized = load_model(str(path))  # the file's values converted to float32
    blocks = load_model(str(path), weights="gguf")
    assert blocks.model.weight_format == "gguf"
    # weights="auto" (the CLI's and the API's default): a model from a GGUF file runs on its own blocks
    assert load_model(str(path), weights="auto").model.weight_format == "gguf"
    assert load_model(str(path), weights="auto", kernels=False).model.weight_format == "float32"
    assert isinstance(blocks.model.lm_head, GgufLinear)
    # the float32 checkpoint is the file dequantized: embeddings and LM head rows (EAGLE's draft vocabulary
    # reads them) come out of the blocks as exactly those values
    ids = torch.tensor([0, 5, 77, 262])
    assert torch.equal(blocks.model.model.embed_tokens(ids), dequantized.model.model.embed_tokens(ids))
    if kind == "llama-untied":  # a quantized load keeps the untied table as the file's blocks: the same rows
        int8 = load_model(str(path), weights="int8")
        assert type(int8.model.model.embed_tokens).__name__ == "PackedEmbedding"
        assert torch.equal(int8.model.model.embed_tokens(ids), dequantized.model.model.embed_tokens(ids))
        assert torch.equal(load_model(str(path), weights="int8").model.model.embed_tokens(ids),
                           int8.model.model.embed_tokens(ids))  # from the packed cache
    assert torch.equal(lm_head_rows(blocks.model, ids), lm_head_rows(dequantized.model, ids))
    with torch.no_grad():
        reference, ours = logits(dequantized.model), logits(blocks.model)
        # same weights; only the activations' int8 rounding differs: per layer under 1%, and through the model
        # as far as random weights let it (random 2- and 3-bit blocks carry a large mean that cancels)
        for name, layer in blocks.model.named_modules():
            if isinstance(layer, GgufLinear):
                assert sum(layer.split_sizes) == layer.out_features, name
                x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0))
                exact = x @ layer.embedding_rows(torch.arange(layer.out_features)).T
                exact = exact if layer.bias is None else exact + layer.bias
                assert (layer.unsplit(x) - exact).norm() / exact.norm() < 0.01, name
        default = quantization["default"] if isinstance(quantization, dict) else quantization
        assert (ours - reference).norm() / reference.norm() < {"Q3_K": 0.25, "IQ4_NL": 0.05}.get(default, 0.03)
        # the second load maps the packed-weight cache and computes the same
        assert packed_cache_path(blocks.path, "gguf").exists()
        assert torch.equal(logits(load_model(str(path), weights="gguf").model), ours)
        # a draft's head cut to the first ids (vocab=N) computes exactly those logits on the blocks too
        assert torch.equal(logits(head_prefix_copy(blocks.model, 112)), ours[..., :112])
    prompt = "hello hello the world"
    expected = SpeculativeGenerator(blocks, None).generate(prompt, 24, chat=False).token_ids
    drafter = make_drafter(f"draft:{path}", blocks, "cpu", "float32")  # verifies several tokens a round
    assert SpeculativeGenerator(blocks, drafter, 4).generate(prompt, 24, chat=False).token_ids == expected
    # the same blocks as the self-draft of the float32 model (quant:gguf): exact, and it agrees with it
    float_expected = SpeculativeGenerator(dequantized, None).generate(prompt, 24, chat=False).token_ids
    self_draft = make_drafter("quant:gguf", dequantized, "cpu", "float32")
    result = SpeculativeGenerator(dequantized, self_draft, 4).generate(prompt, 24, chat=False)
    assert result.token_ids == float_expected and result.stats.acceptance_rate > 0.8
    if kind == "qwen2":  # `--drafter auto` weighs the file's own blocks as the float32 model's self-draft
        from specdec.pairing.candidates import candidates_for

        assert "ngram+quant:gguf" in [c.spec for c in candidates_for(dequantized, "cpu").chosen_from]


def test_vocabulary_sized_matrices_are_packed_a_run_of_rows_at_a_time(tmp_path, monkeypatch):
    """The LM head and embedding table decoded in runs of rows (the last one short and padded) make the very
    buffers decoding them whole does."""
    hf = make_hf_model("llama", seed=6, hidden_size=256, intermediate_size=512, tie_word_embeddings=False)
    path = write_tiny_gguf(tmp_path / "t.gguf", hf, {"default": "Q4_K", "output.weight": "Q6_K"})
    whole = dict(gguf_matrices.GgufMatrices(path).layers())
    monkeypatch.setattr(gguf_matrices, "ROWS_AT_ONCE", 24)  # 263 rows: 10 runs of 24 and one of 23
    in_runs = dict(gguf_matrices.GgufMatrices(path).layers())
    for name in ("lm_head", "model.embed_tokens.table"):
        assert in_runs[name].layout() == whole[name].layout()
        for key in ("packed", "scales", "super_scales"):
            assert torch.equal(getattr(in_runs[name], key), getattr(whole[name], key)), (name, key)


def test_gguf_weights_need_a_gguf_source(tmp_path):
    path = save_tiny_model(tmp_path / "hf", "llama", seed=1)
    with pytest.raises(InvalidParameterError, match="not loaded from a GGUF file"):
        load_model(str(path), weights="gguf")
    with pytest.raises(InvalidParameterError, match="not loaded from a GGUF file"):
        make_drafter("quant:gguf", load_model(str(path)), "cpu", "float32")
    # a type the kernels do not multiply is named, with the ones they do, before any matrix is read
    iq2 = write_tiny_gguf(tmp_path / "iq2.gguf", make_hf_model("llama", seed=1, hidden_size=256, intermediate_size=512),
                          {"default": "Q8_0", "ffn_up.weight": "IQ2_XXS"})
    with pytest.raises(UnsupportedModelError, match="is IQ2_XXS, which the CPU kernels do not multiply.*IQ4_XS"):
        load_model(str(iq2), weights="gguf")
    target = load_model(str(write_tiny_gguf(tmp_path / "q.gguf", make_hf_model("llama", seed=1), "Q8_0")),
                        weights="gguf")
    with pytest.raises(InvalidParameterError, match="made from a float32, bf16 or fp16 target"):
        make_drafter("quant:int4", target, "cpu", "float32")


@pytest.mark.parametrize("kind", ["F16", "BF16", "F32"])
def test_a_float_gguf_runs_on_panels_of_its_own_type(tmp_path, kind):
    """F16 / BF16 / F32 files: their matrices on float panels of the file's type, widened to float32 in the
    kernel: the same logits as the float32 load of the same values, bit for bit."""
    path = write_tiny_gguf(tmp_path / f"{kind}.gguf", make_hf_model("qwen2", seed=2), kind)
    ours = load_model(str(path), weights="auto")
    assert ours.model.weight_format == {"F16": "fp16", "BF16": "bf16", "F32": "float32"}[kind]
    with torch.no_grad():
        assert torch.equal(logits(ours.model), logits(load_model(str(path), weights="float32").model))
    assert torch.equal(logits(load_model(str(path), weights="auto").model), logits(ours.model))  # from the cache


def test_auto_weights_load_a_checkpoint_that_is_no_gguf_as_float32(tmp_path):
    path = save_tiny_model(tmp_path / "hf", "llama", seed=1)
    assert load_model(str(path), weights="auto").model.weight_format == "float32"
    with pytest.raises(InvalidParameterError, match="unknown device"):
        load_model(str(path), weights="auto", device="tpu")
