"""Drafting with a model of another tokenizer: its text, re-tokenized for the target, is a deterministic
draft, so outputs equal plain decoding (greedy, and seeded sampling under the match rule)."""

import pytest
from transformers import AutoTokenizer

from specdec.drafters import make_drafter
from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdec.errors import InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.models.sources.loading import load_model
from tiny_models import make_tokenizer, save_tiny_model

PROMPTS = ["hello hello the world", "in the beginning the", "x", "the cat sat on the mat, the cat"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross")
    target = load_model(str(save_tiny_model(root / "target", "llama", seed=11)))
    bytes_only = make_tokenizer(merges=False)
    other = load_model(str(save_tiny_model(root / "bytes", "llama", seed=12, tokenizer=bytes_only,
                                           vocab_size=len(bytes_only))))
    # the target's own weights behind a tokenizer with one more token: other ids on paper, the same
    # tokenization of ordinary text, so its drafts are the target's own continuation
    same = load_model(str(target.path))
    same.tokenizer = AutoTokenizer.from_pretrained(str(target.path))
    same.tokenizer.add_tokens(["<extra_token>"])
    return {"target": target, "bytes": other, "same-weights": same}


def plain(target, prompt, **sampling):
    return SpeculativeGenerator(target, None).generate(prompt, 30, chat=False, **sampling).token_ids


@pytest.mark.parametrize("draft", ["bytes", "same-weights"])
def test_greedy_and_seeded_outputs_equal_plain_decoding(models, draft):
    target = models["target"]
    accepted = 0
    for prompt in PROMPTS:
        for k in (3, "auto"):
            drafter = CrossTokenizerDrafter(models[draft], target.tokenizer, target.model.vocab_size)
            result = SpeculativeGenerator(target, drafter, k).generate(prompt, 30, chat=False)
            assert result.token_ids == plain(target, prompt), (draft, prompt, k)
            accepted += result.stats.accepted
        drafter = CrossTokenizerDrafter(models[draft], target.tokenizer, target.model.vocab_size)
        sampled = SpeculativeGenerator(target, drafter, 4).generate(prompt, 30, chat=False, temperature=0.8, seed=3)
        assert sampled.token_ids == plain(target, prompt, temperature=0.8, seed=3)
    if draft == "same-weights":
        assert accepted > 30  # the look-behind re-tokenization hands the draft's continuation over intact


def test_draft_spec_picks_text_drafting_for_another_tokenizer(models):
    target = models["target"]
    drafter = make_drafter(f"draft:{models['bytes'].path}", target, "cpu", "float32")
    assert isinstance(drafter, CrossTokenizerDrafter)
    with pytest.raises(InvalidParameterError, match="only weights=FORMAT"):
        make_drafter(f"draft:{models['bytes'].path}@vocab=128", target, "cpu", "float32")
