"""EAGLE and Medusa: the engine's feature plumbing, greedy equality with plain decoding, the trees they
draft, head checkpoints tied to one target, and `specdec train` end to end on a tiny model."""

import itertools
import json
import subprocess
import sys

import pytest
import torch

from head_fixtures import eagle_drafter, medusa_drafter, random_eagle
from specdec.drafters.eagle import EagleDrafter, TreeShape
from specdec.drafters.medusa import default_accuracy, static_tree
from specdec.errors import CorruptModelError, InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.heads.checkpoint import TargetIdentity, load_head, save_head
from specdec.kernels import packed_kernel
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams
from tiny_models import save_tiny_model

PROMPTS = ["hello hello the world", "in the beginning", "x"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {"target": load_model(str(save_tiny_model(root / "target", "llama", seed=21))),
            "other": load_model(str(save_tiny_model(root / "other", "llama", seed=22))),
            "dir": root / "target"}


def plain(target, prompt, max_new=40, **sampling):
    return SpeculativeGenerator(target, None).generate(prompt, max_new, chat=False, **sampling).token_ids


def recording(inner):
    """The feature drafter `inner`, also keeping every feature row the engine hands it (in `.rows`)."""

    class Recording(type(inner)):
        def take_features(self, features):
            self.rows.append(features.clone())
            super().take_features(features)

    inner.__class__ = Recording
    inner.rows = []
    return inner


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_engine_hands_over_the_targets_features_of_every_committed_token(tiny, kind):
    model = tiny["target"].model
    drafter = recording(eagle_drafter(model) if kind == "eagle" else medusa_drafter(model))
    gen = SpeculativeGenerator(tiny["target"], drafter)
    prompt = gen.encode("hello hello the world", chat=False)
    result = gen.generate("hello hello the world", 30, chat=False)
    got = torch.cat(drafter.rows)  # (n, C): features of context[0 .. n-1]
    context = prompt + result.token_ids
    # every token's but the last round's (not needed: generation ended) and the last token's
    assert 1 <= len(context) - 1 - got.shape[0] <= 10
    tokens = torch.tensor([context[: got.shape[0]]])
    out = model.forward(tokens, positions_after(0, tokens.shape[1], 1, "cpu"), model.new_cache(1, 256),
                        hidden_layers=(model.num_layers,))
    torch.testing.assert_close(got, out.hidden_states[model.num_layers][0], atol=2e-4, rtol=1e-4)
    assert result.stats.drafted > 0 and result.stats.rounds < len(result.token_ids) + 1


SHAPES = [TreeShape(1, 1, 1), TreeShape(3, 1, 3), TreeShape(4, 3, 10), TreeShape(6, 4, 24), TreeShape(2, 8, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_eagle_greedy_output_equals_plain_decoding(tiny, shape):
    for seed, prompt in enumerate(PROMPTS):
        drafter = eagle_drafter(tiny["target"].model, shape, seed=seed)
        spec = SpeculativeGenerator(tiny["target"], drafter).generate(prompt, 40, chat=False)
        assert spec.token_ids == plain(tiny["target"], prompt)
        assert spec.stats.drafted > 0


def test_eagle_with_a_small_draft_vocabulary_stays_exact(tiny):
    drafter = eagle_drafter(tiny["target"].model, vocab=torch.arange(0, 263, 5))
    for prompt in PROMPTS:
        assert SpeculativeGenerator(tiny["target"], drafter).generate(prompt, 40, chat=False).token_ids == \
            plain(tiny["target"], prompt)


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_eagle_heads_on_a_mixture_target_are_dense_and_exact(tmp_path, kind):
    """A head's own layer is a plain dense one whatever its target (no experts, sinks or clamped SwiGLU: the
    layer EAGLE and speculators' eagle3 define), and drafting for a mixture target stays exact."""
    from specdec.heads.eagle3 import Eagle3Layer, Eagle3Shape, head_config
    from specdec.models.feed_forward import MLP

    target = load_model(str(save_tiny_model(tmp_path / kind, kind, seed=4)))
    eagle3 = Eagle3Layer(head_config(target.model.config, Eagle3Shape(48, (1, 2))), False)
    for layer in (random_eagle(target.model).module.layer, eagle3):
        assert isinstance(layer.mlp, MLP) and layer.mlp.limit is None and layer.self_attn.sinks is None
    drafter = eagle_drafter(target.model, TreeShape(4, 3, 10), seed=1)
    for prompt in PROMPTS[:2]:
        result = SpeculativeGenerator(target, drafter).generate(prompt, 40, chat=False)
        assert result.token_ids == plain(target, prompt) and result.stats.drafted > 0


@pytest.mark.skipif(packed_kernel() is None, reason="low-bit weights need the CPU kernel")
@pytest.mark.parametrize("weights", ["int8", "int4", "int7"])
@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_head_drafters_on_a_low_bit_target(tiny, weights, kind):
    """A head reads the target's LM head rows (EAGLE's draft vocabulary) whatever format they are stored in."""
    target = load_model(str(tiny["dir"]), weights=weights)
    drafter = eagle_drafter(target.model) if kind == "eagle" else medusa_drafter(target.model)
    for prompt in PROMPTS:
        assert SpeculativeGenerator(target, drafter).generate(prompt, 40, chat=False).token_ids == plain(target, prompt)


@pytest.mark.parametrize("budget", [1, 4, 8, 20])
def test_medusa_greedy_output_equals_plain_decoding(tiny, budget):
    for seed, prompt in enumerate(PROMPTS):
        drafter = medusa_drafter(tiny["target"].model, budget, seed=seed)
        assert SpeculativeGenerator(tiny["target"], drafter).generate(prompt, 40, chat=False).token_ids == \
            plain(tiny["target"], prompt)


class OracleHead:
    """Predicts the target's true feature at the next position of the greedy continuation, whatever the
    input: the node on the greedy path then drafts the target's own choice."""

    def __init__(self, real_head, target, prompt: str, length: int):
        gen = SpeculativeGenerator(target, None)
        full = gen.encode(prompt, chat=False) + gen.generate(prompt, length, chat=False).token_ids
        model = target.model
        out = model.forward(torch.tensor([full]), positions_after(0, len(full), 1, "cpu"), model.new_cache(1, 512),
                            hidden_layers=(model.num_layers,))
        self.features = out.hidden_states[model.num_layers][0]  # (len, C)
        self.real_head = real_head

    def new_cache(self, max_length, batch_size=1):
        return self.real_head.new_cache(max_length, batch_size)

    def fuse(self, features):
        return features

    def scoring_input(self, hidden):
        return hidden

    def __call__(self, token_embeds, features, positions, cache, attn_mask):
        cache.advance(token_embeds.shape[1])
        return self.features[positions[0] + 1].unsqueeze(0)  # (1, T, C): f_{j+1} of the greedy path


def test_a_head_predicting_the_true_features_is_accepted_to_full_depth(tiny):
    """Checks the pairing of features with tokens, positions and tree bookkeeping: with perfect features
    every round accepts `depth` tokens (plus the bonus)."""
    target = tiny["target"]
    # top_k 1: the chain of the draft's argmax, which with true features is the target's greedy path.
    # (Wider trees rank by cumulative draft probability and may prune that path: EAGLE-2's trade-off.)
    drafter = eagle_drafter(target.model, TreeShape(depth=4, top_k=1, budget=4))
    drafter.head = OracleHead(drafter.head, target, "in the beginning", 40)
    drafter.vocab.scorer = None  # float32 rows, as the target scores: its bf16 panels would break near-ties
    result = SpeculativeGenerator(target, drafter).generate("in the beginning", 30, chat=False)
    assert result.token_ids == plain(target, "in the beginning", 30)
    assert result.stats.tau >= 4.5  # 5 per round but the last (cut by max_new_tokens)


def test_eagle_tree_structure_and_head_cache(tiny):
    model = tiny["target"].model
    shape = TreeShape(depth=5, top_k=4, budget=16)
    drafter = eagle_drafter(model, shape)
    gen = SpeculativeGenerator(tiny["target"], drafter)
    prompt = gen.encode("hello hello the world", chat=False)
    drafter.begin(prompt, SamplingParams(), 128)
    out = model.forward(torch.tensor([prompt[:-1]]), positions_after(0, len(prompt) - 1, 1, "cpu"),
                        model.new_cache(1, 128), hidden_layers=(model.num_layers,))
    drafter.take_features(out.hidden_states[model.num_layers][0])
    draft = drafter.propose(prompt, 16, SamplingParams(), None)
    assert len(draft) == 16 and draft.draft_probs is None
    assert all(-1 <= p < i for i, p in enumerate(draft.parents))
    depth = [0] * len(draft)
    for i, p in enumerate(draft.parents):
        depth[i] = 1 if p == -1 else depth[p] + 1
    assert max(depth) <= shape.depth
    siblings = {}
    for i, p in enumerate(draft.parents):
        siblings.setdefault(p, []).append(draft.tokens[i])
    assert all(len(s) == len(set(s)) <= shape.top_k for s in siblings.values())
    assert drafter.cache.length == len(prompt) - 1  # drafted nodes forgotten: committed pairs only


def brute_force_tree(accuracy, budget):
    paths = [p for d in range(1, len(accuracy) + 1) for p in itertools.product(range(len(accuracy[0])), repeat=d)]

    def prob(path):
        value = 1.0
        for depth, rank in enumerate(path):
            value *= accuracy[depth][rank]
        return value

    return set(sorted(paths, key=prob, reverse=True)[:budget])


@pytest.mark.parametrize("budget", [1, 5, 16, 40])
def test_medusa_static_tree_is_the_most_probable_paths(budget):
    accuracy = tuple(tuple(0.5 * 0.7 ** h * 0.45 ** r + 0.001 * (h + r) for r in range(4)) for h in range(3))
    paths = static_tree(accuracy, budget)
    assert set(paths) == brute_force_tree(accuracy, budget)
    seen = set()
    for path in paths:
        assert len(path) == 1 or path[:-1] in seen  # parents first
        seen.add(path)
    assert len(default_accuracy(4)) == 4


def test_head_checkpoint_round_trip_and_target_check(tiny, tmp_path):
    target = tiny["target"]
    head = random_eagle(target.model, seed=3)
    save_head(tmp_path / "head", "eagle", head.module, head.draft_vocab, TargetIdentity.of(target), {"note": 1})
    info = json.loads((tmp_path / "head" / "head.json").read_text())
    assert info["target"]["name"] == target.name and len(info["target"]["weights_sha256"]) == 64
    loaded = load_head(tmp_path / "head", target, ("eagle",))
    for name, value in head.module.state_dict().items():
        torch.testing.assert_close(loaded.module.state_dict()[name], value.to(torch.bfloat16).float())
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    from specdec.drafters import make_drafter
    from specdec.drafters.heads import CPU_TREE
    assert make_drafter(f"eagle:{tmp_path / 'head'}", target, "cpu", "float32").shape == CPU_TREE  # CPU default
    assert make_drafter(f"eagle:{tmp_path / 'head'}@budget=6", target, "cpu", "float32").shape == TreeShape(
        CPU_TREE.depth, CPU_TREE.top_k, 6)
    with pytest.raises(InvalidParameterError, match="weights"):
        load_head(tmp_path / "head", tiny["other"], ("eagle",))  # same tokenizer, other weights
    with pytest.raises(InvalidParameterError, match="not a medusa head"):
        load_head(tmp_path / "head", target, ("medusa",))
    with pytest.raises(InvalidParameterError, match="not a head directory"):
        load_head(tmp_path / "missing", target)
    (tmp_path / "head" / "head.json").write_text("{")
    with pytest.raises(CorruptModelError):
        load_head(tmp_path / "head", target)


def test_a_saved_head_drafts_from_bf16_panels_through_the_cli_and_the_server_as_plain_decoding(tiny, tmp_path, capsys):
    """A head as `specdec train` leaves it on disk (bf16), as users call it: `specdec generate` whole (--json,
    compared with plain decoding) and streamed, and the server's completions whole and streamed."""
    from specdec.cli import main
    from test_server import RunningServer

    target, prompt = tiny["target"], "in the beginning"
    head = random_eagle(target.model, seed=5)
    save_head(tmp_path / "head", "eagle", head.module, head.draft_vocab, TargetIdentity.of(target), {})
    spec = f"eagle:{tmp_path / 'head'}@depth=3,topk=2,budget=4"
    args = ["generate", prompt, "--target", str(tiny["dir"]), "--drafter", spec, "--max-new-tokens", "20", "--no-chat"]
    assert main([*args, "--compare", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["compare"]["identical"] is True and whole["stats"]["drafted"] > 0
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == whole["text"].strip()
    generator = SpeculativeGenerator(target, EagleDrafter(load_head(tmp_path / "head", target, ("eagle",)), target.model,
                                                          TreeShape(depth=3, top_k=2, budget=4), spec))
    if packed_kernel() is not None:
        assert generator.drafter.head.fc.packed.dtype == torch.bfloat16
    running = RunningServer(generator)
    try:
        kwargs = dict(model="tiny", prompt=prompt, max_tokens=20, temperature=0)
        served = running.client.completions.create(**kwargs)
        parts = list(running.client.completions.create(stream=True, **kwargs))
        assert served.choices[0].text == whole["text"] == "".join(part.choices[0].text for part in parts)
        assert served.model_extra["specdec"]["drafted"] > 0
    finally:
        running.stop()


@pytest.mark.parametrize("kind,options,precision", [("eagle", "@depth=3,topk=2,budget=6", "float32"),
                                                    ("medusa", "@budget=6", "bfloat16")])
def test_cli_train_then_generate_with_the_head(tiny, tmp_path, kind, options, precision):
    out = tmp_path / f"{kind}-head"
    env_python = [sys.executable, "-m", "specdec.cli"]
    # the EAGLE head learns from the target in int8 (a cheaper format), then drafts for it in float32
    weights = ["--weights", "int8"] if kind == "eagle" and packed_kernel() is not None else []
    train = subprocess.run(
        env_python + ["train", kind, "--target", str(tiny["dir"]), "--out", str(out), "--steps", "4",
                      "--batch-windows", "2", "--code-tokens", "2000", "--prose-tokens", "1000", "--generated", "3",
                      "--answer-tokens", "40", "--window", "32", "--draft-vocab", "200", "--medusa-heads", "2",
                      "--precision", precision, *weights],
        capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    assert f"training steps in {precision}" in train.stderr
    info = json.loads((out / "head.json").read_text())
    assert info["training"]["config"]["precision"] == precision
    assert info["training"]["validation"]["end_to_end"]["greedy_matches_plain"] is True
    assert info["draft_vocab_size"] <= 200 and info["training"]["steps"] == 4
    if kind == "medusa":
        accuracy = info["training"]["validation"]["rank_accuracy"]
        assert len(accuracy) == 2 and all(len(row) == 10 and 0 <= min(row) <= max(row) <= 1 for row in accuracy)
    gen = subprocess.run(env_python + ["generate", "hello", "--no-chat", "--target", str(tiny["dir"]),
                                       "--drafter", f"{kind}:{out}{options}", "--max-new-tokens",
                                       "12", "--json"], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert json.loads(gen.stdout)["token_ids"] == plain(tiny["target"], "hello", 12)


@pytest.mark.parametrize("flags,requested,expected,said", [
    ({"avx2", "avx512_bf16"}, "auto", "bfloat16", "AVX512-BF16"),
    ({"amx_bf16", "avx512_bf16"}, "auto", "bfloat16", "AMX-BF16"),
    ({"avx2"}, "auto", "float32", "no native bf16"),
    ({"avx2"}, "bfloat16", "bfloat16", "slower than float32"),
    ({"avx512_bf16"}, "float32", "float32", "as asked"),
])
def test_training_precision_follows_the_cpus_native_bf16(monkeypatch, flags, requested, expected, said):
    from specdec.training.precision import resolve_precision

    monkeypatch.setattr("specdec.kernels.build.cpu_flags", lambda: set(flags))
    precision, why = resolve_precision(requested, "cpu")
    assert precision == expected and said in why
    with pytest.raises(InvalidParameterError, match="--precision"):
        resolve_precision("float16", "cpu")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])  # EAGLE-3 fuses 3+ layers: the tiny target has 2
def test_a_bfloat16_training_step_multiplies_in_bf16_and_keeps_float32_weights(tiny, kind):
    """Under training_arithmetic('bfloat16') the step's loss moves by bf16 rounding only (the products ran in bf16:
    the loss is not float32's) and its gradients land on float32 weights; float32's context changes nothing."""
    from specdec.training.features import TOP_K, FeatureSet
    from specdec.training.precision import training_arithmetic
    from specdec.training.train import Objective, TrainConfig, feature_layers, new_head

    model = tiny["target"].model
    generator = torch.Generator().manual_seed(0)
    config = TrainConfig(kind, draft_vocab_size=64, feature_noise=0.0)
    width = model.hidden_size * len(feature_layers(config, model))
    tokens = torch.randint(0, model.vocab_size, (2, 16), generator=generator)
    probs = torch.rand(2, 16, TOP_K, generator=generator)
    batch = FeatureSet(tokens, torch.randn(2, 16, width, generator=generator).half(),
                       torch.randint(0, 64, (2, 16, TOP_K), generator=generator), probs / probs.sum(-1, keepdim=True))
    objective = Objective(config, model, torch.arange(64))

    def fresh_head():
        torch.manual_seed(0)
        return new_head(config, model)

    def step(precision):
        module = fresh_head()
        with training_arithmetic(precision, "cpu"):
            loss, _ = objective(module, batch)
        loss.backward()
        return loss.detach(), module

    exact, _ = step("float32")
    assert torch.equal(exact, objective(fresh_head(), batch)[0].detach())  # float32's context is no context
    rounded, module = step("bfloat16")
    assert rounded.dtype == torch.float32 and not torch.equal(rounded, exact)
    assert torch.isclose(rounded, exact, rtol=0.05)
    assert all(p.dtype == torch.float32 for p in module.parameters())
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)


@pytest.mark.skipif(packed_kernel() is None, reason="int8 weights need the CPU kernel")
def test_features_of_the_target_in_another_format_are_cached_apart(tiny):
    from specdec.training.command import feature_dir
    from specdec.training.corpus import CorpusConfig

    corpus, identity = CorpusConfig(100, 100, 0, 40), TargetIdentity.of(tiny["target"])
    layers = (tiny["target"].model.num_layers,)
    int8 = load_model(str(tiny["dir"]), weights="int8")
    assert feature_dir(tiny["target"], identity, corpus, layers) != feature_dir(int8, identity, corpus, layers)


@pytest.mark.parametrize("spec,message", [
    ("eagle:/nonexistent/head", "not a head directory"),
    ("eagle", "no eagle head ships"),
    ("medusa:/nonexistent@budget=x", "budget='x' is not a whole number"),  # checked before anything loads
])
def test_cli_bad_head_specs_are_one_line_errors(tiny, spec, message):
    run = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "hi", "--no-chat", "--target",
                          str(tiny["dir"]), "--drafter", spec], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


def test_bench_drafter_list_keeps_tree_options_together():
    from specdec.drafters.registry import split_drafter_specs

    assert split_drafter_specs("ngram,eagle@depth=4,topk=4,draft:m@0.4,medusa:d@budget=8,eagle") == [
        "ngram", "eagle@depth=4,topk=4", "draft:m@0.4", "medusa:d@budget=8", "eagle"]
    assert split_drafter_specs("lookahead:4,3,4,ngram+draft:m@weights=int4,lookahead") == [
        "lookahead:4,3,4", "ngram+draft:m@weights=int4", "lookahead"]


def test_tree_options_without_a_head_directory_reach_the_shipped_head(tiny):
    """'eagle@depth=3,topk=2' is the shipped head with options (it was read as an unknown drafter)."""
    from specdec.drafters import make_drafter

    for spec in ("eagle@depth=3,topk=2,budget=4", "medusa@budget=6"):
        with pytest.raises(InvalidParameterError, match="no .* head ships for"):
            make_drafter(spec, tiny["target"], "cpu", "float32")


@pytest.mark.skipif(packed_kernel() is None, reason="needs the CPU kernel")
def test_drafting_runs_a_packed_copy_of_the_head_that_computes_the_same(tiny):
    """On the CPU kernel the drafter drafts with packed projections and draft-vocabulary rows; the trained
    module itself stays unpacked (training saves it after measuring it), and both compute the same."""
    model = tiny["target"].model
    loaded = random_eagle(model, seed=3, vocab=torch.arange(0, model.vocab_size, 3))
    drafter = EagleDrafter(loaded, model, TreeShape(depth=3, top_k=2, budget=4), "eagle:random")
    assert drafter.head is not loaded.module
    assert type(loaded.module.fc) is torch.nn.Linear and type(drafter.head.fc) is not torch.nn.Linear
    assert drafter.fresh().head is drafter.head  # shared, not packed again
    torch.manual_seed(0)
    embeds, features = torch.randn(1, 5, model.hidden_size), torch.randn(1, 5, model.hidden_size)
    positions = positions_after(0, 5, 1, "cpu")
    outputs = [head(embeds, features, positions, head.new_cache(8), None) for head in (loaded.module, drafter.head)]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    # a tree step: three nodes after the five pairs, each seeing the first four pairs and only some of the
    # rest (the packed copy runs it in one C call, attention row by row with a partly shared prefix)
    mask = torch.zeros(1, 3, 8, dtype=torch.bool)
    mask[0, :, :4] = True
    mask[0, 0, [4, 5]] = mask[0, 1, [6]] = mask[0, 2, [4, 6, 7]] = True
    step = [torch.randn(1, 3, model.hidden_size) for _ in range(2)]
    tree = []
    for head in (loaded.module, drafter.head):
        cache = head.new_cache(8)
        head(embeds, features, positions, cache, None)
        tree.append(head(*step, torch.tensor([[5, 5, 6]]), cache, mask))
    assert drafter.head.__dict__.get("_layer_plan") is not None
    torch.testing.assert_close(tree[1], tree[0], rtol=1e-5, atol=1e-5)
    vocab = drafter.vocab  # its rows scored in bf16 panels: the same rows, rounded
    rounded_rows = vocab.rows.bfloat16().float()
    torch.testing.assert_close(vocab.logits(outputs[0][0]), outputs[0][0] @ rounded_rows.T, rtol=1e-5, atol=1e-5)


def test_a_head_holding_bf16_values_drafts_from_bf16_panels_that_compute_the_same(tiny):
    """A head loaded from disk holds bfloat16 values: its packed copy keeps them in two bytes a weight (half
    the bytes a draft step streams), and computes what the float32 module computes."""
    model = tiny["target"].model
    loaded = random_eagle(model, seed=4)
    with torch.no_grad():
        for parameter in loaded.module.parameters():
            parameter.copy_(parameter.bfloat16().float())  # as checkpoint.py saves and loads it
    drafter = EagleDrafter(loaded, model, TreeShape(depth=3, top_k=2, budget=4), "eagle:random")
    packed = [drafter.head.fc, drafter.head.layer.self_attn.qkv_proj, drafter.head.layer.mlp.down_proj]
    assert all(linear.packed.dtype == torch.bfloat16 for linear in packed)
    torch.manual_seed(0)
    embeds, features = torch.randn(1, 5, model.hidden_size), torch.randn(1, 5, model.hidden_size)
    positions = positions_after(0, 5, 1, "cpu")
    outputs = [head(embeds, features, positions, head.new_cache(8), None) for head in (loaded.module, drafter.head)]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def test_request_engines_read_k_auto_as_the_cli_does_for_every_tree_drafter(tiny):
    """A server request's speculative.k 'auto' on a tree drafter drafts the tree's node budget, as the CLI does
    (it used to get chain-style adaptive K of up to 16 nodes); a number is a fixed node count."""
    from specdec.drafters.lookahead import LookaheadDrafter
    from specdec.core.speculation_length import AdaptiveK, FixedK, KSetting

    model = tiny["target"].model
    for drafter in (eagle_drafter(model), medusa_drafter(model), LookaheadDrafter(4, 3, 4)):
        gen = SpeculativeGenerator(tiny["target"], drafter, "auto")
        for k in ("auto", "auto:5", None):
            speculation = gen.request_engine(True, None if k is None else KSetting.parse(k)).speculation
            assert isinstance(speculation, FixedK) and speculation.max_k == drafter.tree_node_budget, (drafter.name, k)
        assert gen.request_engine(True, KSetting(3)).speculation.max_k == 3
        assert gen.request_engine(False, KSetting()).drafter is None
    chain = SpeculativeGenerator(tiny["target"], eagle_drafter(model), 4)
    assert isinstance(SpeculativeGenerator(tiny["target"], None).request_engine(True, KSetting()).speculation, FixedK)
    assert chain.request_engine(True, None).drafter is not chain.drafter  # its own drafter state
    from specdec.drafters.ngram import NgramDrafter

    assert isinstance(SpeculativeGenerator(tiny["target"], NgramDrafter()).request_engine(True, KSetting()).speculation,
                      AdaptiveK)
