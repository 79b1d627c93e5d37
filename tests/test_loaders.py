"""Loader round trips: Hugging Face directory and GGUF (written by the gguf package) -> native model."""

import gguf
import numpy as np
import pytest
import torch

from specdec.errors import CorruptModelError, UnknownModelError
from specdec.kernels import packed_kernel
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from tiny_models import SENTENCEPIECE_EOS, VOCAB, make_hf_model, make_tokenizer, write_tiny_gguf

TOLERANCE = 1e-4
TOKENS = torch.randint(0, VOCAB - 3, (1, 16), generator=torch.Generator().manual_seed(0))


def native_logits(loaded):
    cache = loaded.model.new_cache(1, 32)
    return loaded.model.forward(TOKENS, positions_after(0, 16, 1, "cpu"), cache).logits


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])  # gemma3: 16 tokens cross its window of 8
@pytest.mark.parametrize("backend", ["native", "transformers"])
def test_hf_directory_round_trip(tiny_dirs, kind, backend):
    from transformers import AutoModelForCausalLM

    loaded = load_model(str(tiny_dirs[kind]), backend=backend)
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[kind])).eval()
    with torch.no_grad():
        assert (native_logits(loaded) - reference(TOKENS).logits).abs().max() < TOLERANCE
    assert loaded.backend == backend
    assert loaded.eos_token_ids == (VOCAB - 1,)


def test_bfloat16_load_option(tiny_dirs):
    loaded = load_model(str(tiny_dirs["llama"]), dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    full = load_model(str(tiny_dirs["llama"]))
    assert (native_logits(loaded) - native_logits(full)).abs().max() < 0.5


@pytest.mark.skipif(packed_kernel() is None, reason="bf16 / fp16 panels need the CPU kernel")
@pytest.mark.parametrize("dtype,weights", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_a_half_precision_checkpoint_runs_on_its_own_values_from_half_the_bytes(tmp_path, dtype, weights):
    """weights="auto" keeps a bf16 / fp16 checkpoint in its stored type (the kernel widens it exactly): the same
    logits, to the bit, as the float32 load of the same file, and speculation on it equals its plain decoding."""
    from specdec import SpeculativeGenerator
    from specdec.drafters import make_drafter

    path = tmp_path / weights
    make_hf_model("llama", seed=5).to(dtype).save_pretrained(path)  # untied embeddings
    make_tokenizer().save_pretrained(path)
    half, full = load_model(str(path), weights="auto"), load_model(str(path), weights="float32")
    assert half.model.weight_format == weights and half.model.lm_head.weight_format == weights
    assert full.model.weight_format == "float32"
    assert half.model.model.embed_tokens.table.packed.dtype == dtype  # untied embeddings in two bytes too
    assert torch.equal(native_logits(half), native_logits(full))
    plain = SpeculativeGenerator(half, None).generate("hello the world", 24, chat=False).token_ids
    drafter = make_drafter("quant:int4", half, "cpu", "float32")
    assert SpeculativeGenerator(half, drafter, 4).generate("hello the world", 24, chat=False).token_ids == plain
    rounded = load_model(str(tmp_path / weights), weights="bf16")  # any float checkpoint can be loaded rounded
    assert rounded.model.weight_format == "bf16"


@pytest.mark.parametrize("kind,quantization", [("llama", "F32"), ("qwen2", "F32"), ("qwen3", "F32"), ("llama", "Q8_0"),
                                                ("gemma3", "F32"), ("phi3", "Q8_0"), ("qwen3_moe", "Q8_0"),
                                                ("gpt_oss", "F32")])
def test_gguf_round_trip(tmp_path, kind, quantization):
    # gemma3: llama.cpp's layer pattern (every 6th layer global), which its files do not record; phi3: fused
    # q/k/v and gate/up, partial rotary and longrope's factors, which transformers' GGUF reader drops
    # qwen3_moe: the experts as llama.cpp's three (experts, rows, inputs) tensors, every layer a mixture
    # gpt_oss: gate and up apart, biases, sinks and YaRN's parameters, which transformers' GGUF reader fails on
    # (YaRN's band in whole dimensions, as llama.cpp reads the file)
    overrides = {"gemma3": {"num_hidden_layers": 6, "layer_types": None}, "qwen3_moe": {"mlp_only_layers": []},
                 "gpt_oss": {"yarn_truncate": True}}
    hf = make_hf_model(kind, seed=3, **overrides.get(kind, {}))
    path = write_tiny_gguf(tmp_path / f"tiny-{kind}.gguf", hf, quantization)
    if quantization != "F32":  # the reference carries the same rounding as the file
        with torch.no_grad():
            for param in hf.parameters():
                if param.dim() >= 2:
                    qtype = gguf.GGMLQuantizationType[quantization]
                    rounded = gguf.quants.dequantize(gguf.quants.quantize(param.numpy(), qtype), qtype)
                    param.copy_(torch.from_numpy(np.asarray(rounded, dtype=np.float32).reshape(param.shape)))
    loaded = load_model(str(path))
    with torch.no_grad():
        assert (native_logits(loaded) - hf(TOKENS).logits).abs().max() < TOLERANCE
    text = "hello the world"
    if kind == "gemma3":  # a SentencePiece vocabulary of bytes (tiny_models.write_sentencepiece_vocab)
        assert loaded.tokenizer.decode(loaded.tokenizer.encode(text), skip_special_tokens=True) == text
        assert loaded.eos_token_ids == (SENTENCEPIECE_EOS,) and not loaded.has_chat_template
    else:
        assert loaded.tokenizer.encode(text) == make_tokenizer().encode(text)
        assert loaded.eos_token_ids == (VOCAB - 1,)
        assert loaded.has_chat_template
    # the second load reuses the cached conversion
    cached = sorted(p.name for p in loaded.path.parent.iterdir())
    load_model(str(path))
    assert sorted(p.name for p in loaded.path.parent.iterdir()) == cached


def test_gguf_float32_weights_are_written_only_when_needed(tmp_path):
    """A GGUF converts to config and tokenizer only: runs on its blocks and quantized loads never write the
    float32 safetensors (4-8x the file); the first float32 load writes them, with the same values."""
    from specdec.models.fingerprint import file_sha256, weights_identities, weights_sha256

    path = write_tiny_gguf(tmp_path / "lazy.gguf", make_hf_model("qwen2", seed=6), "Q8_0")
    blocks = load_model(str(path), weights="gguf")
    int4 = load_model(str(path), weights="int4:32")
    assert not list(blocks.path.glob("*.safetensors"))
    assert weights_sha256(blocks.path) == file_sha256(path)  # a head's record does not depend on the write
    float32 = load_model(str(path), kernels=False)
    assert [p.name for p in blocks.path.glob("*.safetensors")] == ["model.safetensors"]
    assert not list(blocks.path.glob(".*partial"))
    assert weights_sha256(blocks.path) == file_sha256(path) and len(weights_identities(blocks.path)) == 2
    with torch.no_grad():
        assert (native_logits(load_model(str(path))) - native_logits(float32)).abs().max() < TOLERANCE
        float32.model.pack_weights("int4:32")  # int4 was quantized in memory from the values written now
        assert torch.equal(native_logits(int4), native_logits(float32))


def test_corrupt_and_missing_files(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(CorruptModelError):
        load_model(str(bad))
    assert_nothing_converted(tmp_path)
    with pytest.raises(UnknownModelError):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(UnknownModelError):
        load_model(str(tmp_path))  # a directory without config.json


def test_truncated_gguf_leaves_nothing(tmp_path):
    hf = make_hf_model("llama", seed=4)
    path = write_tiny_gguf(tmp_path / "t.gguf", hf)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptModelError):
        load_model(str(path))
    assert_nothing_converted(tmp_path)


def assert_nothing_converted(tmp_path) -> None:
    """A failed conversion leaves no directory, finished or partial, in the (per-test) cache."""
    converted = tmp_path / "specdec_home" / "converted"
    assert not converted.exists() or not any(converted.iterdir())


def test_corrupt_safetensors(tiny_dirs, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dirs["llama"], copy)
    (copy / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(CorruptModelError):
        load_model(str(copy))


def test_gguf_file_reads_what_gguf_py_reads(tmp_path):
    """The index reader against gguf-py's GGUFReader on the same file: every tensor's type, shape and bytes,
    the scalar keys; an array longer than SHORT_ARRAY is skipped, not read."""
    from specdec.models.sources import gguf_file

    path = write_tiny_gguf(tmp_path / "index.gguf", make_hf_model("qwen2", seed=3), {"default": "Q8_0",
                                                                                      "ffn_down.weight": "Q4_K"})
    ours, theirs = gguf_file.GgufFile(path), gguf.GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == reference.tensor_type
        assert tuple(mine.shape) == tuple(int(d) for d in reference.shape)
        assert np.array_equal(mine.data, reference.data)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # GGUFReader's own header entries, not metadata
            continue
        if field.types and field.types[0] not in (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING):
            assert ours.field(key) == pytest.approx(field.contents()), key
    tokens = len(theirs.fields["tokenizer.ggml.tokens"].data)
    assert ours.field("tokenizer.ggml.tokens") == theirs.fields["tokenizer.ggml.tokens"].contents()
    short = gguf_file.SHORT_ARRAY
    try:
        gguf_file.SHORT_ARRAY = tokens - 1
        reader = gguf_file.GgufFile(path)
        skipped = reader.field("tokenizer.ggml.tokens")
    finally:
        gguf_file.SHORT_ARRAY = short
    assert (skipped.element_type, skipped.length) == (gguf.GGUFValueType.STRING, tokens)
    assert reader.strings("tokenizer.ggml.tokens") == theirs.fields["tokenizer.ggml.tokens"].contents()  # read when asked


def test_a_warm_gguf_load_reads_no_metadata_array(tmp_path, monkeypatch):
    """After the first load converted the config and tokenizer, loading again needs none of the file's metadata
    arrays (a real tokenizer's run to 151,936 entries) and never gguf-py's GGUFReader."""
    from specdec.models.sources import gguf_file

    path = write_tiny_gguf(tmp_path / "warm.gguf", make_hf_model("qwen2", seed=6), "Q8_0")
    cold = load_model(str(path), weights="gguf")
    monkeypatch.setattr(gguf_file, "SHORT_ARRAY", 0)  # every array counts as long: skipped, never read
    monkeypatch.setattr(gguf.GGUFReader, "__init__", lambda *args, **kwargs: pytest.fail("GGUFReader used"))
    skipped = []
    skip = gguf_file.GgufFile._skip_array
    monkeypatch.setattr(gguf_file.GgufFile, "_skip_array",
                        lambda self, *args: (skipped.append(args[1]), skip(self, *args))[1])
    warm = load_model(str(path), weights="gguf")
    assert VOCAB in skipped  # the tokenizer's arrays were skipped, not read
    with torch.no_grad():
        assert torch.equal(native_logits(warm), native_logits(cold))
