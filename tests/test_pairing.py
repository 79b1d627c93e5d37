"""`--drafter auto` (specdec.pairing): the candidates a target gets (a same-tokenizer model from the user's
folders or the zoo, the quantized self-draft, another tokenizer only where no same one exists, nothing that
does not fit in memory), the replay's arithmetic against known rounds, a decision calibrated once and then
remembered until a file changes, exact output whatever is picked, and `specdec pair`."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.api.options import GeneratorOptions
from specdec.cli import main
from specdec.core.analysis import VerifyCost
from specdec.core.rounds import Draft
from specdec.drafters import policy
from specdec.drafters.base import Drafter
from specdec.drafters.combined import CombinedDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.kernels import packed_kernel
from specdec.models.sources import zoo
from specdec.models.sources.loading import load_model
from specdec.pairing import candidates as candidates_module
from specdec.pairing import decision
from specdec.core.stats import RoundStats
from specdec.pairing.calibration import ReplayedRound, Reference, predicted_speedup, replay
from specdec.pairing.candidates import candidates_for
from specdec.pairing.decision import calibrate
from tiny_models import make_hf_model, write_tiny_gguf

needs_kernel = pytest.mark.skipif(packed_kernel() is None, reason="the quantized self-draft needs the CPU kernel")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A models folder: a 4-layer target, a 1-layer model of the same tokenizer (a quarter of its bytes), and
    the stores of this machine hidden (only the folder counts)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    write_tiny_gguf(mine / "target.gguf", make_hf_model("qwen2", seed=3, num_hidden_layers=6, intermediate_size=512), "F32")
    write_tiny_gguf(mine / "small.gguf", make_hf_model("qwen2", seed=4, num_hidden_layers=1), "F32")
    for name, value in {"OLLAMA_MODELS": tmp_path / "none", "HF_HUB_CACHE": tmp_path / "none",
                        "LMSTUDIO_MODELS": tmp_path / "none", "SPECDEC_MODELS_DIR": mine}.items():
        monkeypatch.setenv(name, str(value))
    return mine


def specs(target, device="cpu"):
    return [candidate.spec for candidate in candidates_for(target, device).chosen_from]


def test_a_same_tokenizer_model_in_the_users_folder_is_a_candidate_behind_lookup(folder):
    target = load_model(str(folder / "target.gguf"), weights="auto")
    found = candidates_for(target, "cpu").chosen_from
    assert found[0].spec == "ngram" and found[0].kind == "lookup"
    same = [c for c in found if c.kind == "same tokenizer"]
    assert len(same) == 1 and same[0].draft_path == folder / "small.gguf"
    assert same[0].spec.startswith(f"ngram+draft:{folder / 'small.gguf'}")
    # the draft is re-quantized and windowed only where it runs on the CPU kernel
    assert ("@weights=int4,context=64" in same[0].spec) == target.model.layers_are_packed()
    assert not [c for c in found if c.kind == "other tokenizer"]  # a same-tokenizer model exists


def test_another_tokenizer_drafts_only_where_no_same_tokenizer_model_exists(folder):
    from tiny_models import make_tokenizer, save_tiny_model

    other = make_tokenizer()
    other.add_tokens(["<other>"])  # one more token: a vocabulary whose ids do not all mean the target's
    save_tiny_model(folder / "other-dir", "llama", seed=5, tokenizer=other, num_hidden_layers=1)
    target = load_model(str(folder / "target.gguf"), weights="auto")
    assert "other tokenizer" not in [c.kind for c in candidates_for(target, "cpu").chosen_from]
    (folder / "small.gguf").unlink()
    found = [c for c in candidates_for(target, "cpu").chosen_from if c.kind != "self-draft"]
    assert [c.kind for c in found] == ["lookup", "other tokenizer"] and found[1].draft_path == folder / "other-dir"
    # its spec builds the drafter it names: a draft through text, behind lookup (no option it refuses)
    from specdec.drafters import make_drafter
    from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
    drafter = make_drafter(found[1].spec, target, "cpu", "float32")
    assert isinstance(drafter.sources[-1], CrossTokenizerDrafter)
    weighed = calibrate(target, "cpu", "float32", candidates_for(target, "cpu")).weighed
    other = next(w for w in weighed if w.kind == "other tokenizer")
    assert not other.problem and other.predicted_speedup > 0  # weighed, not refused


def test_a_candidate_that_does_not_fit_in_memory_is_left_out_with_the_reason(folder, monkeypatch):
    target = load_model(str(folder / "target.gguf"), weights="auto")
    monkeypatch.setattr(candidates_module, "free_memory_bytes", lambda device: 1000)
    found = candidates_for(target, "cpu")
    assert [c.kind for c in found.chosen_from] == ["lookup"]
    assert "small" in found.left_out[0] and all("does not fit" in reason for reason in found.left_out)


def test_the_self_draft_is_weighed_only_for_a_float_target_on_the_kernel(tiny_dirs):
    path = str(tiny_dirs["qwen2"])
    if packed_kernel() is not None:
        assert "ngram+quant:int4" in specs(load_model(path))
        assert "ngram+quant:int4" not in specs(load_model(path, weights="int4"))  # already quantized
    assert not any("quant:" in spec for spec in specs(load_model(path, kernels=False)))  # stock torch layers
    # bfloat16 on a CPU runs on torch's layers: its int4 self-draft lost to lookup over seven tasks
    assert not any("quant:" in spec for spec in specs(load_model(path, dtype="bfloat16")))


def test_an_unpulled_zoo_sibling_counts_by_the_fingerprint_its_entry_records(folder, monkeypatch):
    """A zoo model not yet pulled is a candidate where its recorded fingerprint is the target's."""
    from specdec.models.fingerprint import tokenizer_fingerprint

    target = load_model(str(folder / "target.gguf"), weights="auto")
    entry = zoo.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    sibling = zoo.ZooEntry(entry.name, entry.description, entry.parts, entry.sha256, 1000, entry.architecture,
                           tokenizer_fingerprint(folder / "target.gguf"))
    monkeypatch.setitem(zoo.REGISTRY, entry.name, sibling)
    assert any(c.draft == entry.name for c in candidates_for(target, "cpu").chosen_from)


def test_the_cost_model_of_known_rounds():
    """One source always accepting all 4 drafts at no cost with a flat verify: 5 tokens a step. Half the output
    from it and half from rounds without a draft: the harmonic mix, 1 / (0.5/5 + 0.5/1)."""
    reference = Reference((), 1.0, VerifyCost(slope=0.0))
    model = [ReplayedRound("draft", RoundStats(4, 4, 4, 5, 0.0, 0.0, 0.0)) for _ in range(10)]
    assert predicted_speedup(model, reference) == pytest.approx(5.0)
    plain = [ReplayedRound("none", RoundStats(0, 0, 0, 1, 0.0, 0.0, 0.0)) for _ in range(50)]
    assert predicted_speedup(model + plain, reference) == pytest.approx(1 / (0.5 / 5 + 0.5 / 1))
    # drafts that are never accepted: the best K is 0, plain decoding's speed, never below it
    wrong = [ReplayedRound("draft", RoundStats(4, 4, 0, 1, 0.01, 0.0, 0.0)) for _ in range(10)]
    assert predicted_speedup(wrong, reference) == pytest.approx(1.0)


class Oracle(NgramDrafter):
    """Proposes the reference's own next tokens: every draft accepted (a replay's test of itself)."""

    def __init__(self, truth):
        super().__init__()
        self.truth = truth

    def propose(self, context, max_tokens, params, noise):
        return Draft.chain(self.truth[len(context):len(context) + max_tokens])


def test_a_replay_accepts_exactly_what_agrees_with_the_targets_tokens():
    prompt, continuation = (1, 2, 3), tuple(range(10, 30))
    reference = Reference(((prompt, continuation),), 1.0, VerifyCost(slope=0.0))
    measured = replay(Oracle(list(prompt + continuation)), reference)
    assert measured.agreement == 1.0 and measured.accepted == len(continuation) - measured.rounds + 1
    assert measured.predicted_speedup > 4  # lookup K 8, a flat verify, drafts free
    # a drafter whose every draft is wrong: nothing accepted, one token a round, plain speed
    wrong = replay(Oracle(list(prompt) + [0] * 40), reference)
    assert wrong.accepted == 0 and wrong.rounds == len(continuation) and wrong.predicted_speedup == 1.0


class OracleModel(Drafter):
    """A draft model (not a lookup) proposing the reference's own next tokens after a start of `start_seconds`."""

    name = "oracle-model"

    def __init__(self, truth, start_seconds=0.002):
        self.truth, self.start_seconds, self.started = truth, start_seconds, False

    def begin(self, prompt_ids, params, max_length):
        self.started = False

    def propose(self, context, max_tokens, params, noise):
        self.catch_up_seconds = 0.0 if self.started else self.start_seconds
        if not self.started:
            time.sleep(self.start_seconds)
            self.started = True
        return Draft.chain(self.truth[len(context):len(context) + max_tokens])

    def on_verified(self, context, draft, result):
        pass

    def fresh(self):
        return OracleModel(self.truth, self.start_seconds)


def test_the_replay_of_lookup_and_a_model_is_decided_by_the_speculation_policy(monkeypatch):
    """Calibration predicts the drafter that runs: its replay's rounds are the combined drafter's own, chosen
    by drafters/policy.py (a replay with rules of its own would predict another drafter)."""
    import specdec.drafters.combined as combined_module

    decisions = []

    def recorded(state, after=-1):
        decisions.append(policy.choose(state, after))
        return decisions[-1]

    monkeypatch.setattr(combined_module, "choose", recorded)
    prompt, continuation = (1, 2, 3), tuple(range(10, 70))
    reference = Reference(((prompt, continuation),), 0.010, VerifyCost(slope=0.05))
    measured = replay(CombinedDrafter([NgramDrafter(), OracleModel(list(prompt + continuation))]), reference)
    assert len(decisions) >= measured.rounds * 2  # both passes, every round that drafted
    chosen = [decision.choice for decision in decisions]
    assert policy.Choice.PLAIN in chosen[:policy.MODEL_AFTER_TOKENS]  # the first answer waits before its start
    assert policy.Choice.MODEL in chosen and measured.agreement == 1.0 and measured.predicted_speedup > 2


def test_the_decision_is_remembered_and_made_again_when_a_draft_changes(folder, monkeypatch):
    target = load_model(str(folder / "target.gguf"), weights="auto")
    first = decision.decide(target, "cpu", "float32")
    assert not first.cached and [w.spec for w in first.weighed] == specs(target)
    assert all(not w.problem for w in first.weighed) and first.chosen in specs(target)
    assert first.line and first.calibration_seconds < 60

    def no_calibration(*args):
        raise AssertionError("calibrated again")

    monkeypatch.setattr(decision, "calibrate", no_calibration)
    again = decision.decide(target, "cpu", "float32")
    assert again.cached and again.chosen == first.chosen and "remembered" in again.line
    # the draft file replaced by another model: its content changed, so the decision is made again
    write_tiny_gguf(folder / "small.gguf", make_hf_model("qwen2", seed=9, num_hidden_layers=1), "F32")
    with pytest.raises(AssertionError, match="calibrated again"):
        decision.decide(target, "cpu", "float32")


def test_auto_decodes_exactly_as_plain_whatever_it_picks(folder):
    options = GeneratorOptions(str(folder / "target.gguf"), "auto", 4)
    generator = SpeculativeGenerator.from_options(options)
    plain = SpeculativeGenerator(generator.target, None)
    for prompt in ("hello hello the world the world", "a b c a b c a b"):
        expected = plain.generate(prompt, 24, chat=False).token_ids
        assert generator.generate(prompt, 24, chat=False).token_ids == expected


def test_a_draft_that_cannot_be_pulled_is_weighed_as_nothing(folder, monkeypatch):
    """A zoo sibling that cannot be pulled (offline): a one-line problem in the table, the others decide."""
    from specdec.errors import SpecdecError
    from specdec.models.fingerprint import tokenizer_fingerprint

    (folder / "small.gguf").unlink()
    entry = zoo.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    monkeypatch.setitem(zoo.REGISTRY, entry.name, zoo.ZooEntry(
        entry.name, entry.description, entry.parts, entry.sha256, 1000, entry.architecture,
        tokenizer_fingerprint(folder / "target.gguf")))

    def offline(name):
        raise SpecdecError(f"could not download {name}: no network")

    monkeypatch.setattr(zoo, "ensure_pulled", offline)
    target = load_model(str(folder / "target.gguf"), weights="auto")
    pairing = decision.decide(target, "cpu", "float32")
    sibling = next(w for w in pairing.weighed if w.draft == entry.name)
    assert sibling.problem == f"could not download {entry.name}: no network" and pairing.chosen != sibling.spec


def test_specdec_pair_prints_the_table_and_json(folder, capsys):
    assert main(["pair", str(folder / "target.gguf")]) == 0
    out = capsys.readouterr().out
    assert "ngram" in out and "same tokenizer" in out and "*" in out
    assert main(["pair", str(folder / "target.gguf"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["cached"] and record["chosen"] in [w["spec"] for w in record["weighed"]]
    assert main(["pair", str(folder / "missing.gguf")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_decision_calibrated_on_a_busier_machine_is_made_again_and_the_quieter_one_kept(folder, monkeypatch,
                                                                                          caplog):
    """Issue 88: a busy first run's calibration is not a verdict. Its record says how long a target step took;
    a later run that finds steps much quicker now calibrates again (one warning line), and of two calibrations
    the quieter one's decision is kept."""
    import dataclasses

    target = load_model(str(folder / "target.gguf"), weights="auto")
    first = decision.decide(target, "cpu", "float32")
    record = next((decision.specdec_home() / "pairings").glob("*.json"))
    busy = json.loads(record.read_text()) | {"step_ms": first.step_ms * 10 + 100, "chosen": "ngram"}
    record.write_text(json.dumps(busy))
    calls = []
    real_calibrate = decision.calibrate

    def counted(*args):
        calls.append(args)
        return real_calibrate(*args)

    monkeypatch.setattr(decision, "calibrate", counted)
    with caplog.at_level("WARNING", logger="specdec"):
        again = decision.decide(target, "cpu", "float32")
    assert len(calls) == 1 and not again.cached and "busier" in caplog.text
    assert json.loads(record.read_text())["step_ms"] == pytest.approx(again.step_ms)  # the quieter one written
    calls.clear()
    assert decision.decide(target, "cpu", "float32").cached and not calls  # now as quiet as its record: kept
    # a new calibration that ran busier still than the record it questioned: the record is kept
    record.write_text(json.dumps(busy))
    monkeypatch.setattr(decision, "calibrate", lambda *args: dataclasses.replace(real_calibrate(*args),
                                                                               step_ms=busy["step_ms"] * 2))
    kept = decision.decide(target, "cpu", "float32")
    assert kept.cached and kept.chosen == "ngram" and json.loads(record.read_text())["step_ms"] == busy["step_ms"]


def test_runs_that_realize_well_below_the_prediction_make_the_next_start_calibrate_again(folder, monkeypatch,
                                                                                         caplog, capsys):
    """Issue 88: a decision is a prior. Each run with auto's drafter records what it realized beside the record;
    a start that finds the recent runs' median well below the prediction calibrates again and says so, and the
    runs of the old decision are forgotten. `specdec pair` shows the runs."""
    from specdec.core.stats import RoundStats
    from specdec.pairing import live

    generator = SpeculativeGenerator.from_options(GeneratorOptions(str(folder / "target.gguf"), "auto"))
    pairing = generator.pairing
    record = Path(pairing.record)
    assert pairing is not None and record.is_file()
    generator.generate("a b c", max_new_tokens=24, temperature=0.0)  # a real run, recorded
    runs = live.read_runs(record)
    assert len(runs) == 1 and runs[0].drafter == pairing.chosen and runs[0].realized > 0
    # runs that realized about half of plain decoding's speed (a step of 10 ms timed at the start)
    slow = [RoundStats(0, 0, 0, 1, 0.0, 0.010, 0.0)] * 8 + [RoundStats(4, 4, 0, 1, 0.002, 0.020, 0.0)] * 16
    for _ in range(4):
        decision.record_run(dataclasses.replace(pairing, step_ms_now=10.0), slow)
    assert live.median_realized(live.read_runs(record), pairing.chosen) == pytest.approx(24 * 0.010 / 0.432)
    calls = []
    real_calibrate = decision.calibrate
    monkeypatch.setattr(decision, "calibrate", lambda *args: calls.append(args) or real_calibrate(*args))
    with caplog.at_level("WARNING", logger="specdec"):
        again = decision.decide(generator.target, "cpu", "float32")
    assert len(calls) == 1 and not again.cached and "runs realized" in caplog.text
    assert live.read_runs(record) == []  # the runs were of the old decision
    assert main(["pair", str(folder / "target.gguf")]) == 0
    assert "runs since the calibration: 0" in capsys.readouterr().out
