"""EAGLE-3 heads: exact drafting, `specdec train eagle3`, and the speculators format both ways.

speculators itself (pinned, installed without its dependencies: README's test command) loads our
exports with its own config and model classes, and its modules compute the same draft logits as ours.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from specdec.drafters.eagle import EagleDrafter, TreeShape
from specdec.errors import InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.heads.checkpoint import HeadInfo, LoadedHead, TargetIdentity, load_head, save_head
from specdec.heads.eagle3 import Eagle3Head, Eagle3Shape
from specdec.heads.target_parts import embed, lm_head_rows
from specdec.interop.speculators import export_speculators, load_speculators_head
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from tiny_models import save_tiny_model

PROMPTS = ["hello hello the world", "x"]
CLI = [sys.executable, "-m", "specdec.cli"]


def speculators_or_skip():
    """speculators' eagle3 classes; a missing install fails under CI (it must be tested there)."""
    try:
        from speculators.models.eagle3 import Eagle3DraftModel
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("speculators is not installed (README's test command installs it)")
    return Eagle3DraftModel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    return {"target": load_model(str(save_tiny_model(root / "target", "llama", seed=31, num_hidden_layers=4))),
            "other": load_model(str(save_tiny_model(root / "other", "llama", seed=32, num_hidden_layers=4,
                                                    hidden_size=32))),
            "dir": root / "target"}


def random_eagle3(model, seed=0, layers=(1, 2, 3), vocab=None) -> LoadedHead:
    torch.manual_seed(seed)
    head = Eagle3Head(model.config, Eagle3Shape(96, layers))
    with torch.no_grad():  # norms off 1 so that a misplaced norm shows in the logits
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    vocab = torch.randperm(model.vocab_size)[:180] if vocab is None else vocab
    return LoadedHead(HeadInfo("eagle3"), head.eval(), vocab)


def drafts_of(drafter, target, prompt, max_new=30):
    """Every draft the drafter proposes while generating greedily, and the output."""
    seen = []
    propose = drafter.propose

    def recording(*args, **kwargs):
        draft = propose(*args, **kwargs)
        seen.append((list(draft.tokens), list(draft.parents or [])))
        return draft

    drafter.propose = recording
    result = SpeculativeGenerator(target, drafter).generate(prompt, max_new, chat=False)
    return seen, result.token_ids


def plain(target, prompt, max_new=30):
    return SpeculativeGenerator(target, None).generate(prompt, max_new, chat=False).token_ids


def test_eagle3_head_drafts_exactly_greedy_and_reads_fused_layers(tiny):
    target = tiny["target"]
    drafter = EagleDrafter(random_eagle3(target.model), target.model, TreeShape(4, 3, 10), "eagle3:random")
    assert drafter.feature_layers == (0, 1, 2)  # ids 1..3: the outputs of layers 0..2
    for prompt in PROMPTS:
        drafts, tokens = drafts_of(drafter, target, prompt)
        assert tokens == plain(target, prompt)
        assert drafts and all(len(ids) <= 10 for ids, _ in drafts)


def test_eagle3_drafts_with_a_packed_copy_that_computes_the_same(tiny):
    from specdec.kernels import packed_kernel

    if packed_kernel() is None:
        pytest.skip("needs the CPU kernel")
    model = tiny["target"].model
    loaded = random_eagle3(model, seed=2)
    drafter = EagleDrafter(loaded, model, TreeShape(3, 2, 4), "eagle3:random")
    assert type(loaded.module.fc) is torch.nn.Linear and type(drafter.head.fc) is not torch.nn.Linear
    torch.manual_seed(0)
    embeds, features = torch.randn(1, 5, model.hidden_size), torch.randn(1, 5, 3 * model.hidden_size)
    outputs = []
    for head in (loaded.module, drafter.head):
        with torch.no_grad():
            outputs.append(head(embeds, head.fuse(features), positions_after(0, 5, 1, "cpu"), head.new_cache(8), None))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def test_eagle3_feature_layer_ids_are_checked(tiny):
    config = tiny["target"].model.config
    for bad in [(1,), (0, 1), (1, 4), (2, 2)]:
        with pytest.raises(InvalidParameterError, match="feature layers"):
            Eagle3Head(config, Eagle3Shape(64, bad))


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    target = tiny["target"]
    root = tmp_path_factory.mktemp("exported")
    head = random_eagle3(target.model, seed=4)
    save_head(root / "head", "eagle3", head.module, head.draft_vocab, TargetIdentity.of(target), {})
    export_speculators(root / "head", target, root / "spec")
    return {"head_dir": root / "head", "out": root / "spec", "head": load_head(root / "head", target)}


def test_export_loads_in_speculators_and_computes_the_same_draft_logits(tiny, exported):
    Eagle3DraftModel = speculators_or_skip()
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    target, ours = tiny["target"], exported["head"]
    config = Eagle3SpeculatorConfig.from_pretrained(str(exported["out"]))
    config.transformer_layer_config._attn_implementation = "eager"
    theirs = Eagle3DraftModel.from_pretrained(str(exported["out"]), config=config).float().eval()
    ids = ours.draft_vocab.sort().values
    assert torch.equal(theirs.d2t + torch.arange(len(ids)), ids) and int(theirs.t2d.sum()) == len(ids)
    assert theirs.target_layer_ids == [1, 2, 3]

    # The target's features of a sequence, the pairs (feature of token j, token j+1) as both heads see them.
    model = target.model
    tokens = torch.tensor([target.tokenizer.encode("hello hello the world, said the model")])
    length = tokens.shape[1]
    out = model.forward(tokens, positions_after(0, length, 1, "cpu"), model.new_cache(1, length),
                        hidden_layers=(0, 1, 2))
    features = torch.cat([out.hidden_states[i] for i in (0, 1, 2)], dim=-1)[:, :-1]  # (1, L-1, 3C)
    following = tokens[:, 1:]  # tokens j+1
    with torch.no_grad():
        head = ours.module
        mine = head(embed(model, following), head.fuse(features), torch.arange(length - 1)[None],
                    head.new_cache(length - 1), None)
        my_logits = head.scoring_input(mine) @ lm_head_rows(model, ids).T  # (1, L-1, N) in target-id order
        # speculators' modules, the way its forward runs one step
        hidden = theirs.fc(features)
        both = torch.cat([theirs.embed_tokens(following), hidden], dim=-1)
        positions = 1 + torch.arange(length - 1)[None]  # speculators counts from 1 (rope: only gaps matter)
        rope = theirs.rotary_emb(both, positions)
        causal = torch.full((length - 1, length - 1), float("-inf")).triu(1)[None, None]
        state = theirs.layers[0](both, attention_mask=causal, position_ids=positions, position_embeddings=rope)
        their_logits = theirs.lm_head(theirs.norm(state))
    torch.testing.assert_close(their_logits, my_logits, rtol=0.03, atol=0.03)  # bf16 weights, float32 math
    assert (their_logits.argmax(-1) == my_logits.argmax(-1)).float().mean() > 0.9


def test_import_drafts_as_the_specdec_head_did(tiny, exported):
    target = tiny["target"]
    imported = load_speculators_head(exported["out"], target)
    assert imported.embeddings is None  # the target's own embeddings, not a second table
    shape = TreeShape(4, 3, 10)
    for prompt in PROMPTS:
        before = EagleDrafter(exported["head"], target.model, shape, "specdec")
        after = EagleDrafter(imported, target.model, shape, "speculators")
        drafts_before, tokens = drafts_of(before, target, prompt)
        drafts_after, tokens_after = drafts_of(after, target, prompt)
        assert tokens == tokens_after == plain(target, prompt)
        # the same trees, up to bf16 rounding of the LM-head rows: almost every draft identical
        same = sum(a == b for a, b in zip(drafts_before, drafts_after))
        assert same >= 0.8 * len(drafts_before), (same, len(drafts_before))


def test_the_eagle_repository_layout_imports_as_its_speculators_conversion(tiny, tmp_path):
    """The EAGLE repository's EAGLE-3 layout (a Llama config with draft_vocab_size, `midlayer.` weights in
    pytorch_model.bin, default layer ids) drafts exactly as the same head in speculators' layout."""
    from safetensors.torch import load_file

    from specdec.heads.eagle3 import default_feature_layers

    target = tiny["target"]
    head = random_eagle3(target.model, seed=6, layers=default_feature_layers(target.model.num_layers))
    save_head(tmp_path / "head", "eagle3", head.module, head.draft_vocab, TargetIdentity.of(target), {})
    export_speculators(tmp_path / "head", target, tmp_path / "spec")
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "config.json").write_text(json.dumps({**config["transformer_layer_config"],
                                                        "architectures": ["LlamaForCausalLMEagle3"],
                                                        "draft_vocab_size": config["draft_vocab_size"]}))
    weights = {name.replace("layers.0.", "midlayer.", 1): value
               for name, value in load_file(str(tmp_path / "spec" / "model.safetensors")).items()}
    torch.save(weights, repository / "pytorch_model.bin")
    shape = TreeShape(4, 3, 10)
    speculators_drafter = EagleDrafter(load_speculators_head(tmp_path / "spec", target), target.model, shape, "s")
    repository_drafter = EagleDrafter(load_speculators_head(repository, target), target.model, shape, "r")
    for prompt in PROMPTS:
        assert drafts_of(speculators_drafter, target, prompt) == drafts_of(repository_drafter, target, prompt)


def test_imports_are_checked_against_the_target_and_refuse_what_they_cannot_compute(tiny, exported, tmp_path):
    with pytest.raises(InvalidParameterError, match="hidden size 64"):
        load_speculators_head(exported["out"], tiny["other"])
    config = json.loads((exported["out"] / "config.json").read_text())
    for change, message in [({"norm_output": True}, "norm_output"),
                            ({"speculators_model_type": "dflash"}, "dflash"),
                            ({"transformer_layer_config": {**config["transformer_layer_config"],
                                                           "model_type": "qwen3"}}, "qwen3")]:
        bad = tmp_path / "bad"
        bad.mkdir(exist_ok=True)
        (bad / "model.safetensors").write_bytes((exported["out"] / "model.safetensors").read_bytes())
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(InvalidParameterError, match=message):
            load_speculators_head(bad, tiny["target"])


def test_cli_train_eagle3_export_and_draft_with_the_export(tiny, tmp_path):
    head, spec = tmp_path / "head", tmp_path / "spec"
    train = subprocess.run(
        CLI + ["train", "eagle3", "--target", str(tiny["dir"]), "--out", str(head), "--steps", "4",
               "--batch-windows", "2", "--code-tokens", "2000", "--prose-tokens", "1000", "--generated", "3",
               "--answer-tokens", "40", "--window", "32", "--draft-vocab", "200", "--feature-layers", "1,2,3"],
        capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    info = json.loads((head / "head.json").read_text())
    assert info["kind"] == "eagle3" and info["feature_layer"] == [1, 2, 3]
    assert info["training"]["validation"]["end_to_end"]["greedy_matches_plain"] is True
    assert "top1_depth3" in info["training"]["validation"]
    export = subprocess.run(CLI + ["export", str(head), "--format", "speculators", "--out", str(spec),
                                   "--target", str(tiny["dir"])],
                            capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    assert json.loads((spec / "config.json").read_text())["speculators_model_type"] == "eagle3"
    for drafter in (f"eagle:{head}", f"eagle:{spec}@depth=3,topk=2,budget=6"):
        gen = subprocess.run(CLI + ["generate", "hello", "--no-chat", "--target", str(tiny["dir"]), "--drafter",
                                    drafter, "--max-new-tokens", "12", "--json"],
                             capture_output=True, text=True, timeout=300)
        assert gen.returncode == 0, gen.stderr[-2000:]
        assert json.loads(gen.stdout)["token_ids"] == plain(tiny["target"], "hello", 12)


def test_cli_export_bad_inputs_are_one_line_errors(tiny, exported, tmp_path):
    from head_fixtures import random_eagle

    eagle = random_eagle(tiny["target"].model)
    save_head(tmp_path / "eagle", "eagle", eagle.module, eagle.draft_vocab, TargetIdentity.of(tiny["target"]), {})
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    cases = [
        ([str(tmp_path / "missing"), "--format", "speculators"], "not a head directory"),
        ([str(exported["head_dir"]), "--format", "speculators", "--target", str(tiny["other"].path)], "trained for"),
        ([str(tmp_path / "eagle"), "--format", "speculators"], "EAGLE-3"),
        ([str(tmp_path / "eagle"), "--format", "onnx"], "invalid choice"),
    ]
    for args, message in cases:
        run = subprocess.run(CLI + ["export", *args, "--out", str(tmp_path / "out")], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()
    run = subprocess.run(CLI + ["export", str(tmp_path / "eagle"), "--format", "speculators", "--out",
                                str(tmp_path / "taken")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not a speculators checkpoint" in run.stderr
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
