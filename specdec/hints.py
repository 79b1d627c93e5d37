"""Plain-words advice after a generation where speculation did not help, shown once per kind of advice
(remembered under $SPECDEC_HOME), never on every run."""

from __future__ import annotations

import json

from specdec.paths import specdec_home
from specdec.stats import GenerationStats

MIN_TOKENS = 32  # shorter generations say too little about a drafter
LOW_ACCEPTANCE = 0.1


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
