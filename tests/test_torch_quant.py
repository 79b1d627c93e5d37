"""quant:int8 / quant:int4 on torch's own low-bit operators (models/quantized/torch_quant_linear.py): the quantized
self-draft where the CPU kernel does not serve the target (a GPU, no AVX2 or compiler, bfloat16 weights).
Here the target runs on stock torch layers (`kernels=False`); tests/test_device.py runs the same drafters
in bfloat16 and, with `--device cuda`, on a GPU."""

import pytest
import torch
from torch import nn

from specdec.drafters import make_drafter
from specdec.errors import SpecdecError
from specdec.api.generator import SpeculativeGenerator
from specdec.models.sources.loading import load_model
from specdec.models.quantized.torch_quant_linear import TorchQuantLinear
from tiny_models import save_tiny_model

PROMPTS = ["hello hello the world", "in the beginning", "x"]


@pytest.fixture(scope="module")
def stock_target(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("torch-quant") / "target", "qwen2", seed=11)
    return load_model(str(path), kernels=False)


def linear(out_features: int, in_features: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.weight.data[-1] = 0.0  # an all-zero row must not divide by zero
    return layer


@pytest.mark.parametrize("weights,tolerance", [("int8", 0.01), ("int4", 0.12), ("int4:64", 0.15), ("int4:128", 0.2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_linear_is_close_to_the_float_layer(weights, tolerance, dtype):
    float_layer = linear(96, 256).to(dtype)
    x = torch.randn(5, 3, 256).to(dtype)
    quantized = TorchQuantLinear(float_layer, weights)
    got, expected = quantized(x).float(), float_layer(x).float()
    assert got.shape == (5, 3, 96) and quantized(x).dtype == dtype
    # relative to the output's scale: int8 per channel ~0.4%, int4 per group of 32 ~5%
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()
    assert (got - expected).abs().max() > 0  # really quantized, not the float weights


def test_head_prefix_computes_the_first_outputs_of_the_full_head():
    head = TorchQuantLinear(linear(80, 64, bias=False), "int8")
    x = torch.randn(2, 64)
    assert torch.equal(head.first_outputs(48)(x), head(x)[:, :48])
    with pytest.raises(ValueError, match="not 81"):
        head.first_outputs(81)
    with pytest.raises(ValueError, match="tiles"):  # int4 drafts keep an int8 head, so this never serves vocab=N
        TorchQuantLinear(linear(80, 64, bias=False), "int4").first_outputs(48)


def test_formats_torch_does_not_multiply_are_refused():
    with pytest.raises(ValueError, match="format of the CPU kernel"):
        TorchQuantLinear(linear(16, 64), "int7")
    with pytest.raises(ValueError, match="group size 96"):
        TorchQuantLinear(linear(16, 192), "int4:96")


@pytest.mark.parametrize("spec", ["quant:int8", "quant:int4", "quant:int4:64@vocab=128", "quant:int8@confidence=0.3",
                                  "quant:int4@context=2"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_greedy_output_equals_plain_decoding(stock_target, spec, k):
    for prompt in PROMPTS:
        expected = SpeculativeGenerator(stock_target, None).generate(prompt, 40, chat=False).token_ids
        drafter = make_drafter(spec, stock_target, "cpu", "float32")
        result = SpeculativeGenerator(stock_target, drafter, k).generate(prompt, 40, chat=False)
        assert result.token_ids == expected, f"{spec} K={k} prompt={prompt!r}"


def test_the_draft_quantizes_the_matrices_and_shares_the_rest(stock_target):
    drafter = make_drafter("quant:int8", stock_target, "cpu", "float32")
    target, draft = stock_target.model, drafter.model
    assert isinstance(draft.lm_head, TorchQuantLinear) and type(target.lm_head) is nn.Linear  # target untouched
    assert isinstance(draft.model.layers[0].mlp.down_proj, TorchQuantLinear)
    assert draft.model.embed_tokens.weight is target.model.embed_tokens.weight  # shared, not copied
    assert draft.model.norm.weight is target.model.norm.weight
    int4 = make_drafter("quant:int4", stock_target, "cpu", "float32").model
    assert int4.model.layers[0].self_attn.q_proj.weight_format == "int4"
    assert int4.lm_head.weight_format == "int8"  # the head keeps 8 bits, as the packed form keeps 7
    # int8 weights barely move the tiny model's argmax
    result = SpeculativeGenerator(stock_target, drafter, 4).generate(PROMPTS[0], 40, chat=False)
    assert result.stats.acceptance_rate > 0.8
    assert 0 < drafter.memory_bytes() < sum(p.numel() * p.element_size() for p in target.parameters())


def test_seeded_sampling_repeats(stock_target):
    drafter = make_drafter("quant:int4", stock_target, "cpu", "float32")
    runs = [SpeculativeGenerator(stock_target, drafter.fresh(), 4).generate(
        PROMPTS[0], 30, chat=False, temperature=0.8, seed=5).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("spec,message", [("quant:int7", "int7 needs the CPU kernel"),
                                          ("quant:gguf", "gguf needs the CPU kernel"),
                                          ("quant:int4:96", "group size")])
def test_errors_are_one_clear_line(stock_target, spec, message):
    with pytest.raises(SpecdecError, match=message) as error:
        make_drafter(spec, stock_target, "cpu", "float32")
    assert "\n" not in str(error.value)
