"""A seed decides the text (issue: seeded sampling that does not depend on speculation).

Under the match rule (the default) the token at each position is drawn with that position's uniform, so a
seeded speculative run returns exactly the seeded plain run's tokens, for every drafter, at any K (adaptive K
included) and for trees. Token equality over many prompts and temperatures is the check; the statistical
tests (test_loop_distribution) check that plain sampling by these uniforms has the target's law.
"""

from __future__ import annotations

import pytest
import torch

from head_fixtures import eagle_drafter, medusa_drafter
from specdec.drafters import REGISTRY, make_drafter
from specdec.drafters.combined import CombinedDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.eagle import TreeShape
from specdec.engine import SpeculativeEngine
from specdec.errors import InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.kernels import packed_kernel
from specdec.models.sources.loading import load_model
from specdec.core.randomness import PositionalNoise, Purpose
from specdec.core.sampling import inverse_cdf
from tiny_models import save_tiny_model

PROMPTS = ["hello hello the world", "in the beginning", "x", "the the the the", "a b c a b c a b",
           "once upon a time there was", "1 2 3 4 5 6"]
# (temperature, top_k, top_p, repetition_penalty): 21 (prompt, settings) cases per drafter
SETTINGS = [(0.3, 0, 1.0, 1.0), (0.7, 0, 1.0, 1.0), (1.2, 0, 0.9, 1.0)]
CASES = [(prompt, setting) for prompt in PROMPTS for setting in SETTINGS]
KS = (1, 4, "auto")
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeded")
    return {"target": load_model(str(save_tiny_model(root / "target", "qwen2", seed=11))),
            "draft": load_model(str(save_tiny_model(root / "draft", "qwen2", seed=12, num_hidden_layers=1)))}


def sampling(setting) -> dict:
    temperature, top_k, top_p, penalty = setting
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty)


def generate(target, drafter, k, prompt, setting, seed):
    return SpeculativeGenerator(target, drafter, k).generate(prompt, NEW_TOKENS, chat=False, seed=seed,
                                                             **sampling(setting))


def registry_drafters(models) -> dict:
    target = models["target"]
    out = {}
    for kind in REGISTRY.values():
        if kind.test_spec is None or (kind.name == "quant" and packed_kernel() is None):
            continue
        out[kind.name] = lambda spec=kind.test_spec.format(target=target.path): make_drafter(spec, target, "cpu",
                                                                                              "float32")
    return out


def drafter_factories(models) -> dict:
    target, vocab = models["target"], models["target"].model.vocab_size
    return {
        **registry_drafters(models),  # a new registered drafter is checked here without a test edit
        "draft-random": lambda: DraftModelDrafter(models["draft"], vocab),
        "ngram+draft": lambda: CombinedDrafter([NgramDrafter(), DraftModelDrafter(models["draft"], vocab)]),
        "eagle": lambda: eagle_drafter(target.model, TreeShape(depth=3, top_k=2, budget=6), seed=1),
        "medusa": lambda: medusa_drafter(target.model, budget=6, seed=1),
    }


# every registered drafter with a test spec, and the drafters that need a fixture of their own
NAMES = [kind.name for kind in REGISTRY.values() if kind.test_spec] + ["draft-random", "ngram+draft", "eagle",
                                                                        "medusa"]


@pytest.mark.parametrize("name", NAMES)
def test_seeded_speculative_text_equals_seeded_plain_text(models, name):
    factories = drafter_factories(models)
    if name not in factories:
        pytest.skip(f"{name} needs the CPU kernel")
    target = models["target"]
    accepted = 0
    for index, (prompt, setting) in enumerate(CASES):
        seed = 1000 + index
        plain = generate(target, None, 4, prompt, setting, seed).token_ids
        k = KS[index % len(KS)]  # every K on every drafter, spread over the cases
        result = generate(target, factories[name](), k, prompt, setting, seed)
        assert result.token_ids == plain, f"{name} K={k} {prompt!r} {setting}"
        accepted += result.stats.accepted
    if name in ("draft", "quant", "layerskip"):  # drafts close to the target's: the coupling must accept
        assert accepted > 0, name


def test_same_seed_same_text_at_every_k_with_a_repetition_penalty(models):
    target = models["target"]
    setting = (0.8, 20, 0.95, 1.3)
    for prompt in PROMPTS[:3]:
        texts = {tuple(generate(target, DraftModelDrafter(target, target.model.vocab_size), k, prompt, setting,
                                7).token_ids) for k in (*KS, 9)}
        texts.add(tuple(generate(target, None, 4, prompt, setting, 7).token_ids))
        assert len(texts) == 1, prompt


def test_a_penalty_window_gives_plain_text_at_every_k_for_chains_and_trees(models):
    """repeat_last_n (llama.cpp's and Ollama's window): the draft, the chain's and the tree's verification and
    plain decoding each penalize only the last N tokens before their own position; one of them looking back
    further would change a seeded draw."""
    target = models["target"]
    window = dict(temperature=0.8, top_k=20, top_p=0.95, repetition_penalty=3.0, repeat_last_n=3)
    drafters = {"draft": lambda: DraftModelDrafter(target, target.model.vocab_size),
                "eagle": lambda: eagle_drafter(target.model, TreeShape(depth=3, top_k=2, budget=6), seed=1)}
    differs = 0
    for prompt in PROMPTS[:4]:
        plain = SpeculativeGenerator(target, None, 4).generate(prompt, NEW_TOKENS, chat=False, seed=7, **window)
        for name, make in drafters.items():
            for k in KS:
                result = SpeculativeGenerator(target, make(), k).generate(prompt, NEW_TOKENS, chat=False, seed=7,
                                                                          **window)
                assert result.token_ids == plain.token_ids, (name, k, prompt)
        whole = SpeculativeGenerator(target, None, 4).generate(prompt, NEW_TOKENS, chat=False, seed=7,
                                                               **{**window, "repeat_last_n": -1})
        differs += whole.token_ids != plain.token_ids
    assert differs  # the window is applied: looking back over everything decodes otherwise


def test_a_self_draft_under_the_match_rule_accepts_every_token(models):
    """Draft and target share a distribution: the coupled draws agree at every position."""
    target = models["target"]
    result = generate(target, DraftModelDrafter(target, target.model.vocab_size), 4, "in the beginning",
                      (0.9, 0, 1.0, 1.0), 3)
    assert result.stats.accepted == result.stats.drafted > 0


def test_different_seeds_give_different_texts(models):
    target = models["target"]
    texts = {tuple(generate(target, NgramDrafter(), 4, "in the beginning", (1.0, 0, 1.0, 1.0), seed).token_ids)
             for seed in range(4)}
    assert len(texts) > 1


def test_the_rejection_rule_is_seed_stable_at_a_fixed_k(models):
    target = models["target"]
    texts = [SpeculativeGenerator(target, DraftModelDrafter(models["draft"], target.model.vocab_size), 4,
                                  "rejection").generate("in the beginning", NEW_TOKENS, chat=False, seed=5,
                                                        temperature=1.0).token_ids for _ in range(2)]
    assert texts[0] == texts[1]


def test_an_unknown_acceptance_rule_is_refused(models):
    with pytest.raises(InvalidParameterError, match="acceptance"):
        SpeculativeEngine(models["target"].model, None, None, "coupled")
    with pytest.raises(InvalidParameterError, match="acceptance"):
        SpeculativeGenerator.from_pretrained("no-such-model", acceptance="coupled")  # refused before loading


def test_uniforms_are_a_function_of_seed_position_and_purpose():
    noise = PositionalNoise(42)
    assert noise.uniform(10, Purpose.TOKEN) == PositionalNoise(42).uniform(10, Purpose.TOKEN)
    values = {noise.uniform(10, Purpose.TOKEN), noise.uniform(11, Purpose.TOKEN), noise.uniform(10, Purpose.ACCEPT),
              PositionalNoise(43).uniform(10, Purpose.TOKEN), PositionalNoise(-42).uniform(10, Purpose.TOKEN),
              PositionalNoise(2**64 - 42).uniform(10, Purpose.TOKEN), noise.uniform(10, Purpose.ACCEPT, 1)}
    assert len(values) == 7 and all(0 <= v < 1 for v in values)
    assert noise.uniforms(10, 2, Purpose.TOKEN, "cpu").tolist() == pytest.approx(
        [noise.uniform(10, Purpose.TOKEN), noise.uniform(11, Purpose.TOKEN)])


def test_inverse_cdf_never_draws_a_token_without_mass():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.5, 0.0]])
    assert inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [1, 0]
    assert inverse_cdf(probs, torch.tensor([0.4999, 0.6])).tolist() == [1, 2]
    assert inverse_cdf(probs, torch.tensor([1.0, 1.0])).tolist() == [2, 2]  # rounding up to the total


def test_the_penalty_window_reaches_back_over_the_chain_row_by_row():
    from specdec.core.sampling import repetition_penalized

    logits = torch.ones(3, 6)  # (T, V)
    out = repetition_penalized(logits, torch.tensor([0, 1, 2]), [3, 4], 2.0, window=2)
    assert (out < 1).tolist() == [[False, True, True, False, False, False],   # row 0: history's last 2
                                  [False, False, True, True, False, False],   # row 1: 2, then the chain's 3
                                  [False, False, False, True, True, False]]   # row 2: 3 and 4
    assert (repetition_penalized(logits, torch.tensor([0, 1, 2]), [3, 4], 2.0) < 1).sum() == 3 + 4 + 5
