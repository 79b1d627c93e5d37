"""What the runs of a remembered pairing realized since it was calibrated: live evidence that revises it.

A calibration predicts from a hundred tokens of a built-in mix; a user's answers are the test of it. Each
generation that runs with `--drafter auto`'s choice on the generator's own engine appends one line beside the
decision's record (`<record>.runs.jsonl`): the speedup it realized over plain decoding: its tokens at the
target's step timed at this start (as the calibration times it), over its rounds' time. A later start that finds the recent runs' median well below the prediction
calibrates again and says so; `specdec pair` shows what the runs measured.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from specdec.core.stats import RoundStats

RUNS_KEPT = 16  # the most recent runs judged by: older ones were of another kind of use, or another machine load
RUNS_TO_JUDGE = 3  # fewer runs than this say too little (one answer may be all quoting, or none)
# Realized this many times below the prediction (median of the runs): the calibration was of other conditions.
# Runs of other kinds of text scatter around a prediction by about a quarter; a busy calibration's error is
# larger.
FALLS_SHORT = 1.3
MIN_TOKENS = 16  # a shorter run is mostly its first, cold rounds


@dataclass(frozen=True)
class LiveRun:
    drafter: str
    new_tokens: int
    realized: float  # tokens * plain step / the run's decoding seconds


def realized_speedup(rounds: Sequence[RoundStats], step_seconds: float) -> float | None:
    """The run's speedup over plain decoding: its tokens at one target step each (`step_seconds`, timed at this
    start as the calibration times it, so that realized and predicted are the same measure) over its rounds'
    seconds. None for a run too short to judge by."""
    committed = sum(r.committed for r in rounds)
    seconds = sum(r.draft_seconds + r.verify_seconds + r.other_seconds for r in rounds)
    if committed < MIN_TOKENS or seconds <= 0:
        return None
    return committed * step_seconds / seconds


def runs_path(record: Path) -> Path:
    return record.with_suffix(".runs.jsonl")


def add_run(record: Path, run: LiveRun) -> None:
    """Append `run` beside `record`, keeping the most recent RUNS_KEPT (rewritten whole, then renamed: a run
    that ends mid-write leaves the old list, never half a line)."""
    runs = [*read_runs(record), run][-RUNS_KEPT:]
    path = runs_path(record)
    partial = path.with_suffix(".partial")
    partial.write_text("".join(json.dumps(asdict(r)) + "\n" for r in runs))
    partial.replace(path)


def read_runs(record: Path) -> list[LiveRun]:
    """The runs recorded beside `record` (none where the file is missing or unreadable)."""
    try:
        return [LiveRun(**json.loads(line)) for line in runs_path(record).read_text().splitlines() if line]
    except (OSError, ValueError, TypeError):
        return []


def forget_runs(record: Path) -> None:
    """A new decision: the runs were of the old one."""
    runs_path(record).unlink(missing_ok=True)


def median_realized(runs: Sequence[LiveRun], drafter: str) -> float | None:
    """The median speedup the runs of `drafter` realized, once there are RUNS_TO_JUDGE of them."""
    mine = [run.realized for run in runs if run.drafter == drafter]
    return statistics.median(mine) if len(mine) >= RUNS_TO_JUDGE else None


def falls_short(predicted: float, realized: float | None) -> bool:
    return realized is not None and realized * FALLS_SHORT < predicted
