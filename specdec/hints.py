"""Plain-words advice after a generation where speculation did not help, shown once per kind of advice
(remembered under $SPECDEC_HOME), never on every run."""

from __future__ import annotations

import json

from specdec.api.comparison import PlainComparison
from specdec.models.sources.zoo import DEFAULT_MODEL
from specdec.paths import specdec_home
from specdec.core.stats import GenerationStats

MIN_TOKENS = 32  # shorter generations say too little about a drafter
LOW_ACCEPTANCE = 0.1
NO_GAIN = 1.1  # a measured speedup below this is within a run's noise of none
# Plain decoding faster than this means a small model: a step costs a few ms, so a draft must be almost free
# and mostly accepted to pay, and what pays is text that repeats the prompt, or a larger target.
FAST_PLAIN_TOKENS_PER_SECOND = 40.0


def speculation_hint(stats: GenerationStats) -> tuple[str, str] | None:
    """(key, advice) when this generation's speculation did not pay, else None."""
    if stats.new_tokens < MIN_TOKENS or stats.drafter == "none":
        return None
    if stats.drafted == 0:
        return ("switched-off", f"drafter {stats.drafter} proposed nothing or was switched off (--k auto found "
                "that drafting cost more than it saved); try another drafter (see --drafter)")
    if stats.acceptance_rate >= LOW_ACCEPTANCE:
        return None
    if stats.drafter.startswith("ngram"):
        return ("ngram-low", "n-gram lookup found little to reuse in this answer (it pays where the answer "
                "repeats the prompt: code edits, quoting); for other text try a draft model "
                "(--drafter draft:MODEL) or a quantized self-draft (--drafter quant:int7)")
    return ("low-acceptance", f"drafter {stats.drafter} had {stats.acceptance_rate:.0%} of its tokens accepted; "
            "a drafter closer to the target (a sibling model, a self-draft) would pay more")


def comparison_hint(comparison: PlainComparison, stats: GenerationStats) -> tuple[str, str] | None:
    """(key, advice) when `--compare` measured no real gain; None when it did or the run was too short."""
    speedup = comparison.speedup
    if stats.new_tokens < MIN_TOKENS or speedup >= NO_GAIN:
        return None
    plain = comparison.plain_tokens_per_second
    if plain > FAST_PLAIN_TOKENS_PER_SECOND:
        return ("compare-small-target", f"speculation gained {speedup:.2f}x here: this model decodes "
                f"{plain:.0f} tokens/s plainly ({1000 / plain:.0f} ms a token), so a draft must cost almost nothing "
                "and be mostly accepted to pay. It pays where the answer repeats the prompt (code edits, quoting), "
                f"and on larger targets, such as the default model, {DEFAULT_MODEL} (with no --target; its 0.5B "
                "sibling drafts; docs/performance.md)")
    return ("compare-no-gain", f"speculation gained {speedup:.2f}x here; `specdec bench --drafters "
            "DRAFTER,...` compares drafters on this target over many prompts (docs/drafters.md says which fits)")


def take_unshown(key: str) -> bool:
    """True the first time `key` is asked for (then remembered), False after."""
    path = specdec_home() / "hints_shown.json"
    try:
        shown = set(json.loads(path.read_text()))
    except (OSError, ValueError):
        shown = set()
    if key in shown:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(sorted(shown | {key})))
        partial.replace(path)
    except OSError:
        pass  # a read-only home still gets the hint, just again next time
    return True
