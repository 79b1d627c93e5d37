"""`--drafter auto`: calibrate the candidates (candidates.py, calibration.py), keep the one the cost model
says pays most (or lookup alone), and remember the decision per (target, drafts, machine) so that it costs
nothing the next time; a changed file, another machine or another version of specdec decides again.

A decision is only as good as the minutes it was measured in: a calibration run while the machine was busy
(a user's first run often is: a compile beside it) sees the target's step slowed and a draft model's tokens
slowed more, and drops the model. So each later run times a few target steps first (a fraction of a second)
and, where the remembered calibration's step was much slower than the machine's now, calibrates again and
says so; of two calibrations the one made on the quieter machine is kept. And each run with the decision's
drafter records what it realized (live.py): a start that finds the recent runs' median well below the
prediction calibrates again too, and says so.

    pairing = decide(target, "cpu", "float32")
    print(pairing.line)  # draft qwen2.5-coder-0.5b-instruct (same tokenizer, 0.28 of a step, agreement 0.71): ...
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec import __version__
from specdec.drafters import make_drafter
from specdec.errors import SpecdecError
from specdec.kernels.build import cpuinfo_field
from specdec.models.fingerprint import weights_sha256
from specdec.models.sources import zoo
from specdec.models.sources.content_key import gguf_content_key
from specdec.models.sources.gguf_source import gguf_source
from specdec.models.sources.loading import LoadedModel
from specdec.models.forward_timing import forward_costs
from specdec.pairing.calibration import FORWARD_CONTEXT, Reference, measure_reference, replay
from specdec.pairing import live
from specdec.pairing.candidates import LOOKUP, Candidate, Candidates, candidates_for, target_file
from specdec.paths import specdec_home

logger = logging.getLogger("specdec")

# A model draft must be predicted to beat lookup alone by this much to be kept: it costs memory and a load,
# and a calibration of a hundred tokens is a noisy measure.
MODEL_MARGIN = 1.05
# A remembered calibration whose target step was this much slower than a step timed now was made on a busier
# machine: its draft costs are not today's. Steps move about 10-20% between quiet minutes on these VMs.
BUSIER_THAN_NOW = 1.4
BUSIER_BY_MS = 5.0  # and this much in absolute terms: a small model's sub-millisecond steps jitter by more
STEP_CHECK_REPEATS = 5  # forwards timed (after two untimed) to read the machine's step now


@dataclass(frozen=True)
class Weighed:
    """One candidate and what its replay measured (or why it could not be weighed)."""

    spec: str
    kind: str
    draft: str
    predicted_speedup: float = 0.0
    draft_cost: float = 0.0  # one drafted token / one target step
    agreement: float = 0.0  # drafted tokens the target's decoding accepts
    seconds: float = 0.0  # loading and replaying it
    problem: str = ""


@dataclass(frozen=True)
class Pairing:
    chosen: str  # the drafter spec kept
    weighed: tuple[Weighed, ...]
    left_out: tuple[str, ...]
    step_ms: float  # the target's decode step here
    calibration_seconds: float
    cached: bool = False
    step_ms_now: float = 0.0  # a remembered decision: the target's step when it was checked (0: not checked)
    record: str = ""  # where it is remembered (its live runs are kept beside it)
    realized: float = 0.0  # the median speedup its recent runs realized (0: too few runs yet)
    runs: int = 0  # runs recorded since it was calibrated

    @property
    def predicted(self) -> float:
        """The chosen drafter's predicted speedup."""
        return next(w.predicted_speedup for w in self.weighed if w.spec == self.chosen)

    @property
    def step_seconds_now(self) -> float:
        """The target's step as last timed (at this start where it was checked)."""
        return (self.step_ms_now or self.step_ms) / 1e3

    @property
    def line(self) -> str:
        """What was picked and why, in one line."""
        kept = next(w for w in self.weighed if w.spec == self.chosen)
        lookup = next(w for w in self.weighed if w.spec == LOOKUP)
        how = "remembered" if self.cached else f"calibrated in {self.calibration_seconds:.1f} s"
        if kept.spec == LOOKUP:
            best_model = max((w for w in self.weighed if w.spec != LOOKUP and not w.problem),
                             key=lambda w: w.predicted_speedup, default=None)
            versus = (f"; best model draft {best_model.draft} ({best_model.kind}) predicted "
                      f"{best_model.predicted_speedup:.2f}x"
                      if best_model else "; no model draft found")
            return f"lookup alone: predicted {lookup.predicted_speedup:.2f}x{versus} ({how})"
        return (f"draft {kept.draft} ({kept.kind}, {kept.draft_cost:.2f} of a step, agreement {kept.agreement:.2f})"
                f" with lookup: predicted {kept.predicted_speedup:.2f}x, lookup alone {lookup.predicted_speedup:.2f}x "
                f"({how})")


def decide(target: LoadedModel, device: str, dtype: str, recalibrate: bool = False) -> Pairing:
    """The pairing for `target` on this machine: remembered (unless it was calibrated on a busier machine
    than this one is now, or its recent runs realized well below its prediction), or calibrated now and
    remembered."""
    candidates = candidates_for(target, device)
    record = _record_path(target, device, dtype, candidates)
    remembered, busier = None, False
    if record.exists():
        try:
            remembered = _read(record)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable record is decided again
    if remembered is not None and not recalibrate:
        remembered = _with_runs(remembered, record)
        now_ms = step_ms_now(target)
        checked = dataclasses.replace(remembered, cached=True, step_ms_now=now_ms)
        busier = remembered.step_ms > max(BUSIER_THAN_NOW * now_ms, now_ms + BUSIER_BY_MS)
        if not busier and not live.falls_short(remembered.predicted, remembered.realized or None):
            return checked
        if busier:
            logger.warning(f"specdec: the remembered pairing was calibrated with this machine busier than now (a "
                           f"target step took {remembered.step_ms:.1f} ms, now {now_ms:.1f} ms): calibrating again")
        else:
            logger.warning(f"specdec: the remembered pairing's last {remembered.runs} runs realized "
                           f"{remembered.realized:.2f}x against its predicted {remembered.predicted:.2f}x: "
                           "calibrating again")
    pairing = dataclasses.replace(calibrate(target, device, dtype, candidates), record=str(record))
    if remembered is not None and not recalibrate and remembered.step_ms < pairing.step_ms and busier:
        # the new one ran busier still: keep the quieter one
        return dataclasses.replace(remembered, cached=True, step_ms_now=pairing.step_ms)
    _write(record, pairing)
    live.forget_runs(record)
    return pairing


def _with_runs(remembered: Pairing, record: Path) -> Pairing:
    """The remembered pairing with where it lives and what its runs realized since."""
    runs = live.read_runs(record)
    realized = live.median_realized(runs[-live.RUNS_KEPT:], remembered.chosen)
    return dataclasses.replace(remembered, record=str(record), realized=realized or 0.0,
                               runs=sum(run.drafter == remembered.chosen for run in runs))


def record_run(pairing: Pairing, rounds) -> None:
    """A generation with the pairing's drafter finished (its rounds' RoundStats): what it realized, kept beside
    the record (nothing for a run too short to judge, or a pairing not remembered on disk)."""
    realized = live.realized_speedup(rounds, pairing.step_seconds_now)
    if realized is None or not pairing.record:
        return
    try:
        live.add_run(Path(pairing.record), live.LiveRun(pairing.chosen, sum(r.committed for r in rounds), realized))
    except OSError:
        pass  # a read-only home: the runs are evidence, not needed to generate


def step_ms_now(target: LoadedModel) -> float:
    """One decode step of the target on this machine now, in ms, timed as the calibration times it (the median
    of a few, after the calibration's context)."""
    costs = forward_costs(target.model, context=FORWARD_CONTEXT, sizes=(1,), repeats=STEP_CHECK_REPEATS)
    return costs[0].seconds * 1e3


def calibrate(target: LoadedModel, device: str, dtype: str, candidates: Candidates) -> Pairing:
    started = time.perf_counter()
    reference = measure_reference(target, device, dtype)
    weighed = tuple(_weigh(candidate, target, device, dtype, reference) for candidate in candidates.chosen_from)
    lookup = weighed[0]
    models = [w for w in weighed[1:] if not w.problem and w.predicted_speedup >= MODEL_MARGIN * lookup.predicted_speedup]
    chosen = max(models, key=lambda w: w.predicted_speedup).spec if models else LOOKUP
    return Pairing(chosen, weighed, candidates.left_out, reference.step_seconds * 1e3, time.perf_counter() - started)


def _weigh(candidate: Candidate, target: LoadedModel, device: str, dtype: str, reference: Reference) -> Weighed:
    started = time.perf_counter()
    try:
        if candidate.draft in zoo.REGISTRY and not zoo.is_pulled(candidate.draft):
            logger.warning(f"specdec: pulling {candidate.draft} to weigh it as a draft for {target.name} "
                           f"({zoo.REGISTRY[candidate.draft].size_bytes / 1e6:.0f} MB; --drafter ngram needs none)")
        drafter = make_drafter(candidate.spec, target, device, dtype)
        # the target's step timed again just before the replay: the drafts it is weighed against then ran in
        # the same seconds, under the same load (a compile beside a first run slows a small draft's tokens more)
        beside = dataclasses.replace(reference, step_seconds=step_ms_now(target) / 1e3)
        measured = replay(drafter, beside)
    except SpecdecError as error:  # offline, or a store's model that will not load: weighed as nothing
        return Weighed(candidate.spec, candidate.kind, candidate.draft, problem=str(error).splitlines()[0])
    return Weighed(candidate.spec, candidate.kind, candidate.draft, measured.predicted_speedup, measured.draft_cost,
                   measured.agreement, time.perf_counter() - started)


# -- the remembered decisions ---------------------------------------------------------------------------
def _record_path(target: LoadedModel, device: str, dtype: str, candidates: Candidates) -> Path:
    what = {
        "target": _content_id(target_file(target)), "weights": target.model.weight_format, "device": device,
        "dtype": dtype, "candidates": [[c.spec, _content_id(c.draft_path) if c.draft_path else ""]
                                       for c in candidates.chosen_from],
        "machine": [cpuinfo_field("model name"), os.cpu_count(), torch.get_num_threads(), torch.__version__,
                    torch.cuda.get_device_name(device) if device.startswith("cuda") else ""],
        "specdec": __version__,
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
    return specdec_home() / "pairings" / f"{target.name}-{key}.json"


def _content_id(path: Path) -> str:
    """The file's content key, whatever its path; a zoo file not yet pulled is its entry's digest."""
    if path.is_file():
        return gguf_content_key(path)
    if path.is_dir():
        source = gguf_source(path)
        return gguf_content_key(source) if source is not None else weights_sha256(path)
    entry = zoo.REGISTRY.get(path.stem)
    return entry.sha256 if entry is not None else str(path)


def _write(record: Path, pairing: Pairing) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_suffix(".partial")
    partial.write_text(json.dumps(dataclasses.asdict(pairing), indent=1))
    partial.replace(record)


def _read(record: Path) -> Pairing:
    data = json.loads(record.read_text())
    data["weighed"] = tuple(Weighed(**w) for w in data["weighed"])
    data["left_out"] = tuple(data["left_out"])
    return Pairing(**data)
