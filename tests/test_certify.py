"""`specdec certify`: its statistics are calibrated and have the power they claim, it passes exact
configurations and it fails deliberately broken ones at its default number of draws."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from specdec.core import verify
from specdec.bench.tasks import BenchPrompt
from specdec.certify import CertifySettings, certify_local, goodness_of_fit, homogeneity
from specdec.certify.statistics import detectable_tv
from specdec.cli import main
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.api.generator import SpeculativeGenerator
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams
from tiny_models import save_tiny_model

PROBS = np.array([0.4, 0.2, 0.15, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01])


def draws(rng, probs, n):
    return dict(zip(*np.unique(rng.choice(len(probs), n, p=probs), return_counts=True)))


def shifted(probs, tv):
    """probs with `tv` of mass moved from the first outcome to the last: total variation exactly tv."""
    moved = probs.copy()
    moved[0] -= tv
    moved[-1] += tv
    return moved


def test_false_alarm_rate_is_alpha_and_power_is_as_claimed():
    rng = np.random.default_rng(0)
    exact = dict(enumerate(PROBS))
    alpha, runs, n = 0.05, 1000, 500
    alarms = sum(not goodness_of_fit(draws(rng, PROBS, n), exact, alpha).passed for _ in range(runs))
    two_sample = sum(not homogeneity(draws(rng, PROBS, n), draws(rng, PROBS, n), alpha).passed for _ in range(runs))
    bound = alpha + 4 * np.sqrt(alpha * (1 - alpha) / runs)  # four standard errors
    assert alarms / runs < bound and two_sample / runs < bound
    assert alarms / runs > alpha - 4 * np.sqrt(alpha * (1 - alpha) / runs)  # not conservative to uselessness
    # a deviation of the claimed detectable size is caught at least 80% of the time (less 4 standard errors)
    claimed = goodness_of_fit(draws(rng, PROBS, n), exact, alpha).detectable_tv
    assert claimed == pytest.approx(detectable_tv(len(PROBS) - 1, n, alpha))
    caught = sum(not goodness_of_fit(draws(rng, shifted(PROBS, claimed), n), exact, alpha).passed for _ in range(300))
    assert caught / 300 > 0.8 - 4 * np.sqrt(0.16 / 300)
    claimed_two = homogeneity(draws(rng, PROBS, n), draws(rng, PROBS, n), alpha).detectable_tv
    caught = sum(not homogeneity(draws(rng, shifted(PROBS, claimed_two), n), draws(rng, PROBS, n), alpha).passed
                 for _ in range(300))
    assert caught / 300 > 0.8 - 4 * np.sqrt(0.16 / 300)


def test_an_impossible_outcome_fails_outright():
    result = goodness_of_fit({0: 99, 5: 1}, {0: 0.5, 1: 0.5}, 1e-4)
    assert result.p_value == 0.0 and not result.passed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("certify")
    target = load_model(str(save_tiny_model(root / "target", "qwen2", seed=21)))
    draft = load_model(str(save_tiny_model(root / "draft", "qwen2", seed=22, num_hidden_layers=1)))
    return target, draft


PROMPTS = [BenchPrompt("t", "first", "hello the world", False), BenchPrompt("t", "second", "in the", False)]
SETTINGS = CertifySettings(sampled_prompts=1, greedy_tokens=24)  # the default number of draws
PARAMS = SamplingParams(temperature=1.0)


def run(tiny, acceptance, drafter=None, settings=SETTINGS):
    target, draft = tiny
    drafter = drafter or DraftModelDrafter(draft, target.model.vocab_size)
    generator = SpeculativeGenerator(target, drafter, 3, acceptance)
    return certify_local(generator, PROMPTS, PARAMS, settings, {"acceptance": acceptance}, progress=False)


@pytest.mark.parametrize("acceptance", ["match", "rejection"])
def test_an_exact_configuration_passes(tiny, acceptance):
    settings = dataclasses.replace(SETTINGS, samples=500)  # passing needs no power; failing does (below)
    report = run(tiny, acceptance, settings=settings)
    assert report.passed, report.to_json()
    assert [case.outcome for case in report.greedy] == ["identical", "identical"]
    case = report.sampled[0]
    assert case.draws == settings.samples and case.first_token.alpha == pytest.approx(
        settings.alpha / (2 if acceptance == "rejection" else 1))
    assert (case.seeded_identical == settings.samples) if acceptance == "match" else case.joint.passed
    json.dumps(report.to_json())  # the --json report serializes


class MisprocessedDraft(DraftModelDrafter):
    """A draft model whose reported draft probabilities are not those it sampled from (sharpened): the
    acceptance ratio is then wrong, a classic bug when the drafter's logits processing differs."""

    def propose(self, context, k, params, noise=None):
        draft = super().propose(context, k, params, noise)
        if draft.draft_probs is not None:
            sharpened = draft.draft_probs ** 2
            draft.draft_probs = sharpened / sharpened.sum(-1, keepdim=True)
        return draft


def test_broken_configurations_fail(tiny, monkeypatch):
    target, draft = tiny
    misprocessed = run(tiny, "rejection", MisprocessedDraft(draft, target.model.vocab_size))
    assert not misprocessed.passed
    with monkeypatch.context() as patch:  # the residual without the draft taken out
        patch.setattr(verify, "residual_distribution", lambda target_probs, draft_probs: target_probs)
        assert not run(tiny, "rejection").passed
    with monkeypatch.context() as patch:  # the residual without the clamp at zero
        patch.setattr(verify, "residual_distribution", lambda target_probs, draft_probs: target_probs - draft_probs)
        assert not run(tiny, "rejection").passed


def test_cli_reports_and_exits_by_the_verdict(tiny, tmp_path, capsys, monkeypatch):
    target, draft = tiny
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello the world", "chat": False}) + "\n")
    args = ["certify", "--target", str(target.path), "--drafter", f"draft:{draft.path}", "--k", "3",
            "--prompts", str(prompts), "--samples", "600", "--temperature", "1.0", "--greedy-tokens", "12",
            "--acceptance", "rejection"]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["sampled"][0]["draws"] == 600
    # grossly broken (the residual is the draft's own distribution): caught at 600 draws; the subtle
    # breaks above need the default number
    monkeypatch.setattr(verify, "residual_distribution", lambda target_probs, draft_probs: draft_probs)
    assert main(args) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("bad,message", [
    (["--samples", "1"], "--samples"), (["--alpha", "2"], "--alpha"), (["--prompts", "/nonexistent.jsonl"], "unreadable"),
    (["--drafter", "none"], "no speculation"),
])
def test_bad_input_is_one_line(tiny, bad, message, capsys, monkeypatch):
    target, _ = tiny
    monkeypatch.setenv("SPECDEC_SPEC_BENCH", "/nonexistent/question.jsonl")  # as on a machine without it
    assert main(["certify", "--target", str(target.path), "--drafter", "ngram", *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


class WholeCharactersOnly:
    """A model that never emits a token decoding to part of a UTF-8 character: over the API only text comes
    back, and a random byte-level model's partial characters would all read as the same U+FFFD."""

    def __init__(self, loaded):
        self._model = loaded.model
        ids = range(loaded.model.vocab_size)
        self._banned = torch.tensor(["\ufffd" in loaded.tokenizer.decode([i]) for i in ids])

    def forward(self, *args, **kwargs):
        out = self._model.forward(*args, **kwargs)
        out.logits = out.logits.masked_fill(self._banned.to(out.logits.device), float("-inf"))
        return out

    __call__ = forward

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_an_endpoint_is_certified_against_itself_without_speculation(tiny, monkeypatch):
    """A served configuration through the OpenAI API: its own non-speculative replies as the reference;
    the gross break is caught through the API too; a server that cannot switch speculation off needs a
    reference URL."""
    from specdec.certify.endpoint import Endpoint, certify_endpoint, reference_for
    from specdec.errors import SpecdecError
    from test_server import RunningServer

    target, draft = (dataclasses.replace(loaded, model=WholeCharactersOnly(loaded)) for loaded in tiny)
    generator = SpeculativeGenerator(target, DraftModelDrafter(draft, target.model.vocab_size), 3, "rejection")
    running = RunningServer(generator, max_active=4, max_queue=64)
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{running.port}", "tiny")
        settings = dataclasses.replace(SETTINGS, samples=300, greedy_tokens=12)
        report = certify_endpoint(endpoint, None, PROMPTS, PARAMS, settings, {})
        assert report.passed, report.to_json()
        assert report.configuration["reference"].startswith("same server")
        assert [case.outcome for case in report.greedy] == ["identical", "identical"]
        assert report.sampled[0].joint.dof >= 2
        # texts against texts (no exact probabilities through the API) have less power than the local tests:
        # the gross break (the residual is the draft's distribution) needs more draws
        monkeypatch.setattr(verify, "residual_distribution", lambda target_probs, draft_probs: draft_probs)
        broken = certify_endpoint(endpoint, None, PROMPTS[:1], PARAMS, dataclasses.replace(settings, samples=1000), {})
        assert not broken.passed
    finally:
        running.stop()
    with pytest.raises(SpecdecError, match="--reference"):
        reference_for(Endpoint("http://elsewhere", "m"), None, {"choices": []})
