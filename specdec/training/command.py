"""`specdec train eagle|eagle3|medusa`: corpus -> cached target features -> fitted head -> measured -> saved."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import asdict
from pathlib import Path

from specdec.api.generator import SpeculativeGenerator
from specdec.drafters.eagle import EagleDrafter, TreeShape
from specdec.drafters.medusa import MedusaDrafter
from specdec.errors import InvalidParameterError
from specdec.heads.checkpoint import HeadInfo, LoadedHead, TargetIdentity, read_head_info, save_head
from specdec.heads.target_parts import native_model
from specdec.paths import specdec_home
from specdec.training.corpus import CorpusConfig, build_corpus, generation_prompts
from specdec.training.features import FeatureSet, cache_features, concatenate, draft_vocabulary, pack_sequences
from specdec.training.self_generation import generated_features
from specdec.training.train import Objective, TrainConfig, feature_layers, fit

VALIDATION_FRACTION = 0.05
# End-to-end check after training: the head drafts for the target on prompts it never saw.
VALIDATION_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python class for a stack with push, pop and peek.",
    "Explain what a hash table is and when to use one.",
    "Give three tips for writing readable code.",
]


def feature_dir(target, identity: TargetIdentity, corpus: CorpusConfig, layers: tuple[int, ...]) -> Path:
    key_parts = [asdict(corpus), identity.weights_sha256, identity.tokenizer_sha256]
    if layers != (target.model.num_layers,):  # the final state's caches keep the names they always had
        key_parts.append(list(layers))
    weights = target.model.weight_format
    if weights != "float32":  # features of the target in another format (its GGUF blocks, say) are other values
        key_parts.append(weights)
    key = hashlib.sha256(json.dumps(key_parts).encode())
    return specdec_home() / "features" / f"{target.name}-{key.hexdigest()[:16]}"


def corpus_windows(target, corpus: CorpusConfig, directory: Path, progress: bool) -> list[list[int]]:
    path = directory / "windows.json"
    if path.exists():
        return json.loads(path.read_text())
    windows = build_corpus(target.tokenizer, corpus)
    directory.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(windows))
    partial.replace(path)
    return windows


def measure_end_to_end(target, head: LoadedHead, max_new_tokens: int = 64) -> dict:
    """tau and exactness of the new head drafting for the target (drafting_figures)."""
    drafter = (EagleDrafter(head, target.model, TreeShape(), head.kind) if head.kind in ("eagle", "eagle3")
               else MedusaDrafter(head, target.model, 16, "medusa"))
    return drafting_figures(target, drafter, max_new_tokens)


def drafting_figures(target, drafter, max_new_tokens: int = 64) -> dict:
    """tau and exactness of `drafter` (a head's, or a distilled draft model) drafting for the target, greedy, on
    VALIDATION_PROMPTS, which training never saw."""
    plain, speculative = SpeculativeGenerator(target, None), SpeculativeGenerator(target, drafter)
    taus, matches = [], []
    for prompt in VALIDATION_PROMPTS:
        reference = plain.generate(prompt, max_new_tokens=max_new_tokens)
        result = speculative.generate(prompt, max_new_tokens=max_new_tokens)
        taus.append(result.stats.tau)
        matches.append(result.token_ids == reference.token_ids)
    return {"tau": round(sum(taus) / len(taus), 3), "greedy_matches_plain": all(matches),
            "prompts": len(VALIDATION_PROMPTS), "max_new_tokens": max_new_tokens}


def target_windows(target, corpus: CorpusConfig, layers: tuple[int, ...] | None = None,
                   progress: bool = True) -> tuple[FeatureSet, FeatureSet]:
    """(train, validation): the corpus and the target's own answers to it as windows with the target's features
    at `layers` (None: the final normed state) and top-8 law, computed once and cached (feature_dir). The
    held-out windows are the last ones: the target's own answers when there are any."""
    model = native_model(target.model)
    layers = layers or (model.num_layers,)
    directory = feature_dir(target, TargetIdentity.of(target), corpus, layers)
    windows = corpus_windows(target, corpus, directory, progress)
    text = cache_features(model, windows, directory / "shards", progress=progress, layers=layers) if windows else None
    parts = [text] if text is not None else []
    if corpus.generated_answers:
        prompts = generation_prompts(corpus.generated_answers, random.Random(corpus.seed + 1))
        answers = generated_features(target, prompts, corpus.answer_tokens, directory / "generated", corpus.seed,
                                     progress, layers)
        parts.append(pack_sequences(answers, corpus.window))
    parts = [part for part in parts if len(part)]
    if sum(map(len, parts)) < 2:
        raise InvalidParameterError("the corpus is too small: fewer than two training windows "
                                    "(raise --code-tokens, --prose-tokens or --generated, or lower --window)")
    return concatenate(parts).split(VALIDATION_FRACTION)


def run_training(kind: str, target, out_dir: Path, corpus: CorpusConfig, config: TrainConfig,
                 progress: bool = True) -> HeadInfo:
    """Train a head for `target` (a LoadedModel, native backend) and save it to out_dir."""
    model = native_model(target.model)
    identity = TargetIdentity.of(target)
    train, validation = target_windows(target, corpus, feature_layers(config, model), progress)
    vocab, coverage = draft_vocabulary(train, config.draft_vocab_size)
    checkpoint = specdec_home() / "training" / (
        hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16] + f"-{kind}.pt")
    module, figures = fit(config, model, train, vocab, checkpoint, progress)
    figures["validation"] = Objective(config, model, vocab).validate(module, validation)
    figures["draft_vocab_coverage"] = round(coverage, 4)
    figures["corpus"] = asdict(corpus)
    figures["config"] = config.to_dict()
    print(f"specdec: measuring the {kind} head end to end on {len(VALIDATION_PROMPTS)} prompts", file=sys.stderr)
    head = LoadedHead(HeadInfo(kind, identity, target.name, figures), module, vocab)
    figures["validation"]["end_to_end"] = measure_end_to_end(target, head)
    save_head(out_dir, kind, module, vocab, identity, figures)
    checkpoint.unlink(missing_ok=True)
    return read_head_info(out_dir)
