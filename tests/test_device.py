"""Every drafter on the device named by `--device` (default cpu), in float32 and bfloat16.

CI runs this file on the CPU; on a machine with a GPU: `pytest tests/test_device.py --device cuda`.
What must hold there: greedy speculative output equals plain decoding of the same target, token for
token, up to near-ties (where the target's own top two logits differ by less than the rounding of a
batched forward: GPU matmuls and bfloat16 are not batch-invariant, see docs/runtime.md); seeded sampling
is reproducible; the chain verifier's sampled law is the target's (10^6 rounds on the device); quant:int8
and quant:int4 run on torch's own low-bit operators off the CPU kernel; what needs the kernel (int7, gguf)
fails with one clear error. On a GPU all of it runs through CUDA graphs
(models/cuda_graphs.py), checked against the eager forward at the end.
"""

import numpy as np
import pytest
import torch

from head_fixtures import eagle_drafter, medusa_drafter
from specdec.heads.datastore import build_datastore
from specdec.drafters import make_drafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from stats_checks import assert_distribution
from test_verify_distribution import CASES, accepted_count_law, run_verifier
from tiny_models import save_tiny_model

DTYPES = ["float32", "bfloat16"]
PROMPTS = ["hello hello the world", "in the beginning"]
NEW_TOKENS = 32
# Largest logit gap (relative to the logits' scale) at which a divergence counts as a near-tie.
NEAR_TIE = {"float32": 1e-4, "bfloat16": 2e-2}
DRAFTERS = ["ngram", "draft-model", "draft-self", "layerskip", "lookahead", "eagle", "medusa", "retrieval", "quant-int8",
            "quant-int4"]


@pytest.fixture(scope="module", params=DTYPES)
def models(request, device, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"device-{request.param}")
    target_dir = save_tiny_model(root / "target", "qwen2", seed=21)
    draft_dir = save_tiny_model(root / "draft", "qwen2", seed=22, num_hidden_layers=1)
    target = load_model(str(target_dir), device=device, dtype=request.param)
    return {"dtype": request.param, "target": target, "root": root,
            "draft": load_model(str(draft_dir), device=device, dtype=request.param)}


def plain(target, prompt: str, **options):
    return SpeculativeGenerator(target, None).generate(prompt, NEW_TOKENS, chat=False, **options)


def build_drafter(name: str, models: dict, device: str):
    target = models["target"]
    vocab = target.model.vocab_size
    if name == "ngram":
        return NgramDrafter()
    if name == "draft-model":
        return DraftModelDrafter(models["draft"], vocab)
    if name == "draft-self":  # every draft accepted: deep rounds, the bonus path, cache rollback never used
        return DraftModelDrafter(target, vocab)
    if name == "layerskip":
        return make_drafter("layerskip:first:1", target, device, models["dtype"])
    if name.startswith("quant-"):  # the CPU kernel in float32 on a CPU, torch's low-bit operators elsewhere
        return make_drafter(f"quant:{name.removeprefix('quant-')}", target, device, models["dtype"])
    if name == "lookahead":
        return LookaheadDrafter(4, 3, 4)
    if name == "eagle":
        return eagle_drafter(target.model)
    if name == "medusa":
        return medusa_drafter(target.model)
    if name == "retrieval":
        store = models["root"] / "store"
        if not store.exists():  # a corpus holding the target's own continuations: long retrieved matches
            corpus = models["root"] / "corpus.txt"
            corpus.write_text("\n".join(p + plain(target, p).text for p in PROMPTS) * 3)
            build_datastore([corpus], target.tokenizer, vocab, store, "tiny", progress=False)
        return make_drafter(f"retrieval:{store}", target, device, models["dtype"])
    raise ValueError(name)


def assert_equal_up_to_near_tie(target, prompt: str, expected: list[int], got: list[int], dtype: str,
                                device: str) -> None:
    if got == expected:
        return
    if torch.device(device).type == "cpu" and dtype == "float32":
        raise AssertionError(f"float32 on the CPU kernel is bit-exact: {got} != {expected}")
    at = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b) if got[:len(expected)] != expected \
        else len(expected)
    assert at < min(len(expected), len(got)), f"one output stops early: {got} vs {expected}"
    ids = target.tokenizer.encode(prompt, add_special_tokens=False) + expected[:at]
    model = target.model
    cache = model.new_cache(1, len(ids))
    tokens = torch.tensor([ids], device=device)
    logits = model.forward(tokens, positions_after(0, len(ids), 1, device), cache, last_logits_only=True).logits[0, -1]
    gap = float(logits[expected[at]] - logits[got[at]])
    scale = float(logits.abs().max())
    assert gap <= NEAR_TIE[dtype] * scale, (
        f"diverged at token {at}: plain {expected[at]} vs speculative {got[at]}, logit gap {gap:.3g} "
        f"(scale {scale:.3g}) is no near-tie")


def test_model_lives_on_the_device(models, device):
    model = models["target"].model
    assert model.device.type == torch.device(device).type
    assert model.dtype == getattr(torch, models["dtype"])


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_greedy_output_equals_plain_decoding(models, device, drafter, k):
    target = models["target"]
    for prompt in PROMPTS:
        expected = plain(target, prompt).token_ids
        result = SpeculativeGenerator(target, build_drafter(drafter, models, device), k).generate(
            prompt, NEW_TOKENS, chat=False)
        assert_equal_up_to_near_tie(target, prompt, expected, result.token_ids, models["dtype"], device)
        assert result.stats.rounds >= 1 and result.stats.new_tokens == len(result.token_ids)
    if drafter == "draft-self":  # the target drafting for itself is always right (near-ties aside)
        assert result.stats.acceptance_rate > 0.9


@pytest.mark.parametrize("drafter", ["ngram", "draft-model", "eagle"])
def test_seeded_sampling_is_reproducible(models, device, drafter):
    target = models["target"]
    runs = [SpeculativeGenerator(target, build_drafter(drafter, models, device), 4).generate(
        PROMPTS[0], NEW_TOKENS, chat=False, temperature=0.8, top_p=0.95, seed=7).token_ids for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(0 <= t < target.model.vocab_size for t in runs[0])


def test_cpu_kernel_formats_fail_clearly(models, device):
    if torch.device(device).type == "cpu" and models["dtype"] == "float32":
        pytest.skip("the CPU kernel serves this combination (tests/test_engine.py)")
    with pytest.raises(InvalidParameterError, match="CPU kernel"):
        load_model(str(models["target"].path), device=device, dtype=models["dtype"], weights="int4")
    with pytest.raises(InvalidParameterError, match="int7 needs the CPU kernel"):  # int8 / int4 run on torch's ops
        make_drafter("quant:int7", models["target"], device, models["dtype"])


@pytest.mark.parametrize("name,target,draft", [CASES[1], CASES[3]], ids=[CASES[1][0], CASES[3][0]])
def test_chain_verifier_law_on_the_device(device, name, target, draft):
    first, num_accepted, draft_rows = run_verifier(target, draft, device=device)
    assert_distribution(np.bincount(first, minlength=target.shape[1]), target[0].numpy(), what=f"{name}: first token")
    assert_distribution(np.bincount(num_accepted, minlength=target.shape[0]), accepted_count_law(target, draft_rows),
                        what=f"{name}: accepted count")


def test_a_verifier_that_accepts_one_wrong_draft_is_caught(models, device, monkeypatch):
    """The near-tie allowance must not hide a real bug: a greedy verifier that also keeps the first
    rejected draft token fails the equality check."""
    from specdec.engine import round as engine_round
    from specdec.core.rounds import VerifyResult

    def accepts_one_more(target_logits, draft):
        choice = target_logits.argmax(-1).tolist()
        count = 0
        while count < len(draft) and draft.tokens[count] == choice[count]:
            count += 1
        count = min(count + 1, len(draft))
        return VerifyResult(len(draft), list(range(count)), draft.tokens[:count] + [choice[count]])

    monkeypatch.setattr(engine_round, "verify_chain_greedy", accepts_one_more)
    target = models["target"]
    prompt = PROMPTS[0]
    expected = plain(target, prompt).token_ids
    got = SpeculativeGenerator(target, build_drafter("draft-model", models, device), 4).generate(
        prompt, NEW_TOKENS, chat=False).token_ids
    with pytest.raises(AssertionError):
        assert_equal_up_to_near_tie(target, prompt, expected, got, models["dtype"], device)


def test_cuda_graphs_replay_what_the_eager_forward_computes(models, device):
    """On a GPU the native model replays its decode and verify forwards as CUDA graphs (every test above
    runs through them); the eager forward of the same weights must agree, step and generation."""
    if torch.device(device).type != "cuda":
        pytest.skip("CUDA graphs need a GPU (tests/test_cuda_graphs.py checks their static forward on the CPU)")
    target = models["target"]
    eager = load_model(str(target.path), device=device, dtype=models["dtype"], cuda_graphs=False)
    assert target.model.graphs is not None and eager.model.graphs is None
    before = target.model.graphs.replays
    prompt = PROMPTS[0]
    got = plain(target, prompt).token_ids
    assert target.model.graphs.replays >= NEW_TOKENS - 3  # every step after the first of its kind
    assert target.model.graphs.replays > before
    assert_equal_up_to_near_tie(target, prompt, plain(eager, prompt).token_ids, got, models["dtype"], device)
    ids = target.tokenizer.encode(prompt, add_special_tokens=False)
    tolerance = {"float32": 1e-4, "bfloat16": 5e-2}[models["dtype"]]
    for num_new in (1, 5):
        logits = []
        for model in (target.model, eager.model):
            cache = model.new_cache(1, len(ids) + 16)
            model.forward(torch.tensor([ids], device=device), positions_after(0, len(ids), 1, device), cache)
            step = torch.arange(7, 7 + num_new, device=device).unsqueeze(0)
            for _ in range(3):  # seen, captured, replayed
                cache.truncate(len(ids))
                out = model.forward(step, positions_after(len(ids), num_new, 1, device), cache)
            logits.append(out.logits)
        scale = float(logits[1].abs().max())
        assert float((logits[0] - logits[1]).abs().max()) <= tolerance * scale
