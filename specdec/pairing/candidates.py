"""Which drafters `--drafter auto` weighs for a target: lookup always; a smaller model whose token ids mean
the target's (same tokenizer fingerprint), found among the user's local models or in the zoo; the target
quantized as its own draft where its weights are float; a model of another tokenizer (drafting through text)
only where no same-tokenizer model exists. Every model candidate rides behind lookup (`ngram+...`): lookup
costs nothing when it has no match, and copies verbatim when it has. A candidate that would not fit in memory
beside the target is left out, with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from specdec.models.fingerprint import tokenizer_fingerprint
from specdec.models.sources import zoo
from specdec.models.sources.gguf_source import gguf_source
from specdec.models.sources.loading import LoadedModel
from specdec.models.sources.local_models import (DRAFT_SIZE_SHARE, LocalModel, gguf_facts, describe,
                                                 draft_candidates, found_models)

LOOKUP = "ngram"
# A draft step is memory-bound on a CPU: re-quantized to 4 bits it reads half the bytes of Q8 blocks and a
# quarter of float16's (in groups of 128 inputs where a model's width allows: fewer scales to read); it reads
# only the prompt's tail (lookup covers what repeats the prompt).
DRAFT_GROUP = 128
DRAFT_CONTEXT = 64
# Its first proposal (once lookup has drafted the answer's first tokens) prefills only the last few committed
# tokens: a short answer never earns back a whole window's prefill.
DRAFT_START = 16
# A large byte-pair vocabulary's head is a big share of a small draft's weights, and ids come roughly in
# frequency order: the draft's head is cut to the first ids.
HEAD_CUT_ABOVE, HEAD_CUT_TO = 65_536, 32_768
FLOAT_FILE_TYPES = ("ALL_F32", "F16", "BF16")  # a GGUF of float blocks: no cheaper copy in it
MOST_SAME_TOKENIZER = 2  # same-tokenizer drafts calibrated: the smallest and the largest that qualify


@dataclass(frozen=True)
class Candidate:
    spec: str  # the drafter spec (registry grammar)
    kind: str  # "lookup", "same tokenizer", "self-draft" or "other tokenizer"
    draft: str = ""  # the draft model's name, where there is one
    draft_path: Path | None = None  # its file or directory (the pairing's cache key reads its content)
    draft_bytes: int = 0


@dataclass(frozen=True)
class Candidates:
    chosen_from: tuple[Candidate, ...]
    left_out: tuple[str, ...]  # "NAME: why" for models that qualified but were not weighed


def target_file(target: LoadedModel) -> Path:
    """The file the target's weights came from: its GGUF where it was converted from one, else its directory."""
    return gguf_source(target.path) or target.path


def stored_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def free_memory_bytes(device: str) -> int:
    """What a draft may take on `device`: the GPU's free memory, or the memory the OS can give without swapping."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def candidates_for(target: LoadedModel, device: str, local: list[LocalModel] | None = None) -> Candidates:
    """The drafters to calibrate for `target` loaded on `device`; `local`: the models found (default: every
    store's, described)."""
    local = [describe(model) for model in found_models()] if local is None else local
    own_file = target_file(target)
    me = LocalModel(target.name, "target", own_file, stored_bytes(own_file), fingerprint=tokenizer_fingerprint(own_file))
    same = _same_tokenizer(me, local)
    chosen, left_out = [Candidate(LOOKUP, "lookup")], []
    free = free_memory_bytes(device)
    for model in [*same, *([] if same else _other_tokenizer(me, local))]:
        if model.size_bytes > free:
            left_out.append(f"{model.name}: {model.size_bytes / 1e9:.1f} GB does not fit in the "
                            f"{free / 1e9:.1f} GB free")
            continue
        kind = "same tokenizer" if model in same else "other tokenizer"
        chosen.append(Candidate(f"{LOOKUP}+draft:{_reference(model)}{_draft_options(target, device, kind)}", kind,
                                model.name, model.path, model.size_bytes))
    self_draft = _self_draft(target)
    if self_draft:
        # its copy: the GGUF's blocks, or 4-bit weights (about an eighth of float32's bytes)
        size = stored_bytes(own_file) if self_draft == "quant:gguf" else target.model.nbytes // 8
        if size > free:
            left_out.append(f"{self_draft}: {size / 1e9:.1f} GB does not fit in the {free / 1e9:.1f} GB free")
        else:
            chosen.append(Candidate(f"{LOOKUP}+{self_draft}", "self-draft", target.name, own_file, size))
    return Candidates(tuple(chosen), tuple(left_out))


def _same_tokenizer(me: LocalModel, local: list[LocalModel]) -> list[LocalModel]:
    """The smallest and the largest qualifying model (local first; a zoo model not yet pulled counts, by the
    fingerprint its entry records)."""
    pulled = {model.name for model in local if model.store == "zoo"}
    unpulled = [LocalModel(entry.name, "zoo", zoo.model_dir(entry.name) / f"{entry.name}.gguf", entry.size_bytes,
                           entry.architecture, fingerprint=entry.tokenizer_fingerprint)
                for entry in zoo.REGISTRY.values() if entry.name not in pulled and entry.tokenizer_fingerprint]
    found = sorted(_distinct(draft_candidates(me, [*local, *unpulled])), key=lambda model: model.size_bytes)
    return found if len(found) <= MOST_SAME_TOKENIZER else [found[0], found[-1]]


def _other_tokenizer(me: LocalModel, local: list[LocalModel]) -> list[LocalModel]:
    """The smallest readable model of another tokenizer within the draft size share, if any."""
    others = [model for model in local if model.fingerprint and model.fingerprint != me.fingerprint
              and model.size_bytes <= DRAFT_SIZE_SHARE * me.size_bytes]
    return sorted(others, key=lambda model: model.size_bytes)[:1]


def _distinct(models: list[LocalModel]) -> list[LocalModel]:
    """One model per file content size and fingerprint: a zoo file linked into a store is one candidate."""
    seen, kept = set(), []
    for model in models:
        if (model.size_bytes, model.fingerprint) not in seen:
            seen.add((model.size_bytes, model.fingerprint))
            kept.append(model)
    return kept


def _reference(model: LocalModel) -> str:
    """How a spec names the model: its zoo or store name where it has one, else its path."""
    return model.name if model.store != "models-dir" else str(model.path)


def _draft_options(target: LoadedModel, device: str, kind: str) -> str:
    if device != "cpu" or not target.model.layers_are_packed():
        return ""  # re-quantization runs on the CPU kernel
    group = f":{DRAFT_GROUP}" if target.model.hidden_size % DRAFT_GROUP == 0 else ""  # a sibling's width too
    options = f"weights=int4{group}"
    if kind != "same tokenizer":
        return f"@{options}"  # a draft through text reads its own tokens: its window and head are not ids
    options += f",context={DRAFT_CONTEXT},start={DRAFT_START}"
    if target.model.vocab_size > HEAD_CUT_ABOVE:
        options += f",vocab={HEAD_CUT_TO}"
    return f"@{options}"


def _self_draft(target: LoadedModel) -> str | None:
    """quant:gguf (the GGUF's own blocks) or quant:int4 for a float target on the CPU kernel; None otherwise
    (a target already quantized has no cheaper copy of itself worth drafting with)."""
    model = target.model
    if model.weight_format not in ("float32", "bf16", "fp16") or not model.layers_are_packed():
        return None
    source = gguf_source(target.path)
    quantized_blocks = source is not None and gguf_facts(source)[2] not in FLOAT_FILE_TYPES
    return "quant:gguf" if quantized_blocks else "quant:int4"
