"""Drafts distilled toward their target (`specdec train distill`) and LoRA adapters merged into a draft at load:
the merge is PEFT's, the merged draft stays exact (greedy and seeded) through the API, the CLI and the server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.drafters.registry import make_drafter
from specdec.errors import InvalidParameterError
from specdec.kernels.build import packed_kernel
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.training.distill import LORA_MODULES, distillation_loss
from tiny_models import save_tiny_model

CLI = [sys.executable, "-m", "specdec.cli"]
PROMPTS = ["hello hello the world", "in the beginning"]


def random_adapter(model_dir, out, seed: int = 0):
    """A LoRA adapter in PEFT's format with random B matrices (a fresh one adds nothing); returns the
    transformers model PEFT merges it into."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=LORA_MODULES))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(out)
    return model.merge_and_unload().eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target_dir = save_tiny_model(root / "target", "qwen2", seed=31)
    draft_dir = save_tiny_model(root / "draft", "qwen2", seed=32, num_hidden_layers=1)
    merged = random_adapter(draft_dir, root / "adapter")
    return {"target": load_model(str(target_dir)), "target_dir": target_dir, "draft_dir": draft_dir,
            "adapter": root / "adapter", "merged": merged}


def plain(target, prompt, max_new=30, **sampling):
    return SpeculativeGenerator(target, None).generate(prompt, max_new, chat=False, **sampling).token_ids


def native_logits(model, ids):
    return model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), model.new_cache(1, ids.shape[1])).logits


def test_an_adapter_merges_into_the_native_draft_as_peft_merges_it_into_transformers(tiny):
    ids = torch.tensor([[3, 17, 42, 8, 99, 5]])
    merged = load_model(str(tiny["draft_dir"]), kernels=False, adapter=str(tiny["adapter"])).model
    bare = load_model(str(tiny["draft_dir"]), kernels=False).model
    expected = tiny["merged"](ids).logits
    torch.testing.assert_close(native_logits(merged, ids), expected, atol=1e-4, rtol=1e-4)
    assert (native_logits(bare, ids) - expected).abs().max() > 0.1  # the adapter moved the draft


@pytest.mark.skipif(packed_kernel() is None, reason="low-bit weights run on the CPU kernel")
def test_a_merged_low_bit_draft_is_cached_apart_from_the_bare_one(tiny):
    from specdec.paths import specdec_home

    ids = torch.tensor([[3, 17, 42, 8]])
    first = load_model(str(tiny["draft_dir"]), weights="int8", adapter=str(tiny["adapter"])).model
    assert any("-lora-" in path.name for path in (specdec_home() / "packed").iterdir())
    again = load_model(str(tiny["draft_dir"]), weights="int8", adapter=str(tiny["adapter"])).model  # from the cache
    bare = load_model(str(tiny["draft_dir"]), weights="int8").model
    assert torch.equal(native_logits(first, ids), native_logits(again, ids))
    assert not torch.allclose(native_logits(first, ids), native_logits(bare, ids))


def test_an_adapted_draft_is_exact_greedy_and_seeded(tiny):
    target, spec = tiny["target"], f"draft:{tiny['draft_dir']}@adapter={tiny['adapter']}"
    drafted = 0
    for prompt in PROMPTS:
        for k in (3, "auto"):
            result = SpeculativeGenerator(target, make_drafter(spec, target, "cpu", "float32"), k).generate(
                prompt, 30, chat=False)
            assert result.token_ids == plain(target, prompt), (prompt, k)
            drafted += result.stats.drafted
        sampled = SpeculativeGenerator(target, make_drafter(spec, target, "cpu", "float32"), 4).generate(
            prompt, 30, chat=False, temperature=0.8, seed=3)
        assert sampled.token_ids == plain(target, prompt, temperature=0.8, seed=3)
    assert drafted > 0


def test_the_distillation_loss_is_the_cross_entropy_against_the_targets_top_law_over_the_drafts_ids():
    logits = torch.tensor([[[2.0, 0.0, -1.0, 0.5]]])  # (1, 1, V=4)
    top_ids = torch.tensor([[[1, 3, 7]]])  # id 7 is past the draft's head: it weighs nothing
    top_probs = torch.tensor([[[0.5, 0.3, 0.2]]])
    loss, agreement = distillation_loss(logits, top_ids, top_probs)
    log_probs = torch.log_softmax(logits[0, 0], -1)
    assert loss.item() == pytest.approx(-(0.5 * log_probs[1] + 0.3 * log_probs[3]).item() / 0.8, rel=1e-6)
    assert agreement.item() == 0.0  # the draft's argmax (id 0) is not the target's top token (id 1)
    logits[0, 0, 1] = 5.0
    assert distillation_loss(logits, top_ids, top_probs)[1].item() == 1.0


def test_cli_train_distill_then_draft_with_the_adapter_whole_streamed_and_served(tiny, tmp_path, capsys):
    from specdec.cli import main
    from test_server import RunningServer

    out = tmp_path / "distilled"
    train = subprocess.run(
        CLI + ["train", "distill", "--target", str(tiny["target_dir"]), "--draft", str(tiny["draft_dir"]),
               "--out", str(out), "--steps", "30", "--batch-windows", "2", "--learning-rate", "3e-2",
               "--lora-rank", "4", "--code-tokens", "2000", "--prose-tokens", "1000", "--generated", "3",
               "--answer-tokens", "40", "--window", "32", "--draft-weights", "float32", "--precision", "float32"],
        capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    assert {"adapter_config.json", "adapter_model.safetensors", "distill.json"} <= {p.name for p in out.iterdir()}
    figures = json.loads((out / "distill.json").read_text())
    before, after = figures["validation"]["before"], figures["validation"]["after"]
    assert after["loss"] < before["loss"]  # the draft learned the target's law on windows it never saw
    assert figures["end_to_end"]["with"]["greedy_matches_plain"] is True
    spec = f"draft:{tiny['draft_dir']}@adapter={out}"
    args = ["generate", PROMPTS[1], "--target", str(tiny["target_dir"]), "--drafter", spec, "--max-new-tokens", "20",
            "--no-chat"]
    assert main([*args, "--compare", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["compare"]["identical"] is True and whole["stats"]["drafted"] > 0
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == whole["text"].strip()
    running = RunningServer(SpeculativeGenerator(tiny["target"], make_drafter(spec, tiny["target"], "cpu", "float32")))
    try:
        kwargs = dict(model="tiny", prompt=PROMPTS[1], max_tokens=20, temperature=0)
        served = running.client.completions.create(**kwargs)
        parts = list(running.client.completions.create(stream=True, **kwargs))
        assert served.choices[0].text == whole["text"] == "".join(part.choices[0].text for part in parts)
    finally:
        running.stop()


@pytest.mark.parametrize("args,message", [
    (["generate", "hi", "--drafter", "draft:{draft}@adapter=/nonexistent"], "not a LoRA adapter directory"),
    (["train", "distill", "--out", "{tmp}/out"], "--draft names the draft model"),
    (["train", "eagle", "--draft", "{draft}", "--out", "{tmp}/out"], "only distill takes it"),
])
def test_cli_bad_adapter_uses_are_one_line_errors(tiny, tmp_path, args, message):
    args = [arg.format(draft=tiny["draft_dir"], tmp=tmp_path) for arg in args]
    run = subprocess.run(CLI + args + ["--target", str(tiny["target_dir"])] + (["--no-chat"] if args[0] == "generate" else []),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_an_adapter_does_not_merge_into_a_gguf_files_own_blocks():
    from specdec.models.sources.loading import checked_adapter_key

    with pytest.raises(InvalidParameterError, match="not with weights gguf"):
        checked_adapter_key("/any", "draft", "native", "gguf")
