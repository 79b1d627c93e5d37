"""AdaptiveK (`--k auto`) against simulated drafters: it must find the K that pays and leave it when
drafting does not pay."""

import numpy as np
import pytest

from specdec.core.speculation_length import AdaptiveK

STEP = 0.047  # seconds of a one-token target forward
EXTRA = 0.008  # each further verified token


def simulate(acceptance: float, draft_per_token: float, catch_up_per_token: float = 0.0, rounds: int = 300,
             seed: int = 0, useless_rounds: int = 0, step: float = STEP, extra: float = EXTRA,
             pass_ratio=None, min_k: int = 0) -> list[int]:
    """Ks chosen over `rounds` rounds; a draft model skipped by K = 0 rounds catches up on those tokens in
    its next round, at `catch_up_per_token` each. The first `useless_rounds` rounds accept nothing (text
    the draft cannot predict), then `acceptance` holds. A verification over T rows costs step + extra (T - 1),
    or step * pass_ratio(T) where given."""
    rng = np.random.default_rng(seed)
    choose = AdaptiveK(max_k=8, min_k=min_k)
    skipped = 0
    for index in range(rounds):
        k = choose.next_k()
        if k == 0:
            skipped += 1
            choose.observe(0, 0, 0.0, step)
            continue
        accepted = 0
        while accepted < k and index >= useless_rounds and rng.random() < acceptance:
            accepted += 1
        draft_seconds = draft_per_token * k + catch_up_per_token * skipped
        skipped = 0
        choose.observe(k, accepted, draft_seconds, step * pass_ratio(k + 1) if pass_ratio else step + extra * k)
    return choose.history


def test_cheap_accurate_draft_gets_a_long_k():
    assert np.mean(simulate(0.9, 0.002)[-100:]) >= 5


def test_useless_draft_is_switched_off():
    assert np.mean(np.array(simulate(0.05, 0.015)[-100:]) == 0) > 0.8


def test_a_k_bounded_below_drafts_every_round_and_still_fits_its_length():
    """A combined drafter's model: whether it drafts is decided by measured rates; its K stays >= 1."""
    assert min(simulate(0.05, 0.015, min_k=1)) == 1
    assert np.mean(simulate(0.9, 0.002, min_k=1)[-100:]) >= 5


def test_catch_up_after_plain_steps_does_not_keep_k_at_zero():
    """The int4 1.5B with its int4 0.5B draft: 15 ms a draft token, acceptance ~0.9; after plain steps the
    draft feeds the skipped tokens in one forward (here 5 ms each). Counting that as drafting cost made
    one exploratory K = 1 round look like 80 ms a draft token, and K stayed 0 once it had gone there (here:
    after 60 rounds of text the draft cannot predict)."""
    history = simulate(0.9, 0.015, catch_up_per_token=0.005, rounds=400, useless_rounds=60)
    assert np.mean(np.array(history[40:60]) == 0) > 0.5  # off while drafting does not pay
    assert np.mean(history[-100:]) >= 2  # and back on once it does


def test_a_draft_dearer_than_a_plain_step_is_not_probed_again():
    """A draft token costing more than a plain step (torch's int4 operators drafting for a float32 CPU
    target: c 1.35-2.3) cannot pay at any acceptance; probing it every 16 rounds, with the catch-up each
    probe brings, halved the speed. Once measured, it stays off."""
    history = simulate(1.0, 1.3 * STEP, catch_up_per_token=1.3 * STEP, rounds=200)
    assert sum(k > 0 for k in history[10:]) == 0
    # a draft just under a plain step still gets its probes (it might pay at high acceptance)
    history = simulate(1.0, 0.9 * STEP, rounds=200)
    assert sum(k > 0 for k in history[10:]) > 0


def test_positions_never_drafted_borrow_the_measured_acceptance():
    """The float32 1.5B with its int4 self-draft on code (measured): 97-100% of draft tokens accepted,
    38 ms a draft token, verify 125 ms + 20 ms a token. K = 6-8 pays best (14 tokens/s against 13 at
    K = 3); with a fixed prior (0.6) for the positions never tried, K stayed at 3 for 29 of 32 rounds."""
    history = simulate(0.99, 0.038, rounds=40, step=0.125, extra=0.020)
    assert np.mean(history[-20:]) >= 5


def test_k_is_read_once_into_a_setting_that_prints_as_it_was_written():
    from specdec.core.speculation_length import MAX_AUTO_K, MAX_K, FixedK, KSetting
    from specdec.errors import InvalidParameterError

    assert KSetting.parse("auto").new_length().max_k == MAX_AUTO_K and KSetting.parse("auto") == KSetting()
    assert KSetting.parse("auto:5").new_length().max_k == 5 and str(KSetting.parse("auto:5")) == "auto:5"
    assert KSetting.parse("7") == KSetting.parse(7) == KSetting(7) and isinstance(KSetting(7).new_length(), FixedK)
    setting = KSetting.parse("auto:3")
    assert KSetting.parse(setting) is setting and str(KSetting()) == "auto" and str(KSetting(4)) == "4"
    for bad in ("0", MAX_K + 1, "auto:0", f"auto:{MAX_K + 1}", "auto:x", "four", 2.0, True, None):
        with pytest.raises(InvalidParameterError):
            KSetting.parse(bad)
    with pytest.raises(InvalidParameterError):  # JSON sends numbers as numbers
        KSetting.parse("4", numbers_as_text=False)


def test_each_source_of_a_combined_drafter_gets_its_own_k():
    """A lookup's verbatim copies (accepted ~97%), its one-token guesses (~15%) and plain steps, mixed
    round by round as on prose: one AdaptiveK over all of them drafts every source short; SourceLengths
    drafts the copies long and the guesses short."""
    from specdec.core.speculation_length import SourceLengths

    rng = np.random.default_rng(0)
    per_source, pooled = SourceLengths(16), AdaptiveK(max_k=16)
    kinds = {"verbatim": 0.97, "guess": 0.15}
    chosen: dict = {"verbatim": [], "guess": [], "pooled verbatim": []}
    for index in range(600):
        kind = ("verbatim", "guess", None)[index % 3]
        if kind is None:  # a round nobody drafted
            per_source.observe(0, 0, 0.0, STEP)
            pooled.observe(0, 0, 0.0, STEP)
            continue
        for speculation, k in ((per_source, per_source.next_k_for(kind)), (pooled, pooled.next_k())):
            accepted = 0
            while accepted < k and rng.random() < kinds[kind]:
                accepted += 1
            speculation.observe(k, accepted, 0.0001 * k, STEP + EXTRA * k, kind if speculation is per_source else None)
            if speculation is per_source:
                chosen[kind].append(k)
            elif kind == "verbatim":
                chosen["pooled verbatim"].append(k)
    assert np.mean(chosen["verbatim"][-50:]) >= 8
    assert np.mean(chosen["guess"][-50:]) <= 2
    assert np.mean(chosen["pooled verbatim"][-50:]) < 0.6 * np.mean(chosen["verbatim"][-50:])
    assert per_source.next_k() == 16  # the engine's cap: what any source may draft


# A verification pass over T rows against a one-token step (docs/performance.md, Zen 4): the dense 1.5B's
# GGUF blocks, and a layer of Qwen3-30B-A3B's shape, where T rows pick up to 8 T of 128 experts.
DENSE_PASS = {1: 1.0, 2: 1.08, 4: 1.25, 8: 1.62, 16: 2.86}
MOE_PASS = {1: 1.0, 2: 1.27, 4: 1.79, 8: 2.25, 16: 3.52}


def measured(ratios: dict[int, float]):
    sizes = sorted(ratios)
    return lambda rows: float(np.interp(rows, sizes, [ratios[n] for n in sizes]))


def expected_rate(k: int, acceptance: float, draft_per_token: float, pass_ratio) -> float:
    """Tokens a second at a fixed K with independent acceptance: (1 + a + ... + a^K) / (draft K + pass)."""
    return sum(acceptance ** i for i in range(k + 1)) / (draft_per_token * k + STEP * pass_ratio(k + 1))


@pytest.mark.parametrize("acceptance", [0.3, 0.6, 0.85])
def test_verification_that_reads_more_experts_gets_a_shorter_k_and_never_loses(acceptance):
    """On a mixture of experts a pass over a few rows reads several times the experts of a step, so it costs
    more than a dense model's: AdaptiveK, measuring each pass's cost by its rows, drafts less there where
    acceptance is moderate (at high acceptance both go long: past 4 rows the mixture's pass grows slowly),
    and the K it settles on is never slower than plain decoding (K = 0) and near the best K's speed."""
    dense, moe = measured(DENSE_PASS), measured(MOE_PASS)
    moe_ks = simulate(acceptance, 0.001, pass_ratio=moe, rounds=400)[-150:]
    if acceptance < 0.8:
        assert np.mean(moe_ks) < np.mean(simulate(acceptance, 0.001, pass_ratio=dense, rounds=400)[-150:])
    settled = int(np.bincount(moe_ks).argmax())
    rates = [expected_rate(k, acceptance, 0.001, moe) for k in range(9)]
    assert rates[settled] >= 0.97 * rates[0] and rates[settled] >= 0.9 * max(rates)
