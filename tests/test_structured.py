"""Constrained generation is exact: greedy output equals plain constrained decoding for every drafter,
the sampled law is the target's masked to the grammar (and a verifier that skips the mask is caught),
and outputs match their schemas."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from mock_models import MockLM, MockTokenizer, mock_loaded
from specdec.api.generator import SpeculativeGenerator
from specdec.api.structured import GrammarSpec
from specdec.core.commit import StopCriteria
from specdec.core.constraint import Constraint
from specdec.core.sampling import SamplingParams, processed_probs
from specdec.core.speculation_length import FixedK
from specdec.drafters import REGISTRY, make_drafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine import SpeculativeEngine, run_alone
from specdec.errors import InvalidParameterError
from stats_checks import assert_distribution

VOCAB, PROMPT, NEW_TOKENS = 4, [1, 2, 1], 3
OUTCOMES = list(itertools.product(range(VOCAB), repeat=NEW_TOKENS))


def allowed_after(new: tuple[int, ...]) -> set[int]:
    """A toy grammar over 4 tokens: after a 3 only 1 may follow (a forced token); elsewhere any token whose
    running sum with the new tokens is not 2 mod 4."""
    if new and new[-1] == 3:
        return {1}
    return {t for t in range(VOCAB) if (sum(new) + t) % 4 != 2}


class ToyConstraint(Constraint):
    def __init__(self, mask_rows: bool = True):
        self.new: tuple[int, ...] = ()
        self.mask_rows = mask_rows  # False: a broken verifier that never masks (the test must catch it)

    def forced(self, limit):
        forced, state = [], self.new
        while len(forced) < limit and len(allowed := allowed_after(state)) == 1:
            forced.append(next(iter(allowed)))
            state += (forced[-1],)
        return forced

    def allowed_prefix(self, tokens):
        state = self.new
        for count, token in enumerate(tokens):
            if token not in allowed_after(state):
                return count
            state += (token,)
        return len(tokens)

    def masks(self, paths):
        rows = torch.zeros(len(paths), VOCAB, dtype=torch.bool)
        for row, path in enumerate(paths):
            rows[row, sorted(allowed_after(self.new + tuple(path)) if self.mask_rows else range(VOCAB))] = True
        return rows

    def commit(self, tokens):
        self.new += tuple(tokens)

    @property
    def complete(self):
        return False


def masked_law(target: MockLM, params: SamplingParams) -> np.ndarray:
    law = []
    for outcome in OUTCOMES:
        prob, prefix = 1.0, tuple(PROMPT)
        for position, token in enumerate(outcome):
            logits = target.logits_after(prefix).clone()
            forbidden = [t for t in range(VOCAB) if t not in allowed_after(outcome[:position])]
            logits[forbidden] = float("-inf")
            prob *= float(processed_probs(logits.unsqueeze(0), params, torch.tensor(prefix))[0, token])
            prefix += (token,)
        law.append(prob)
    return np.array(law)


def toy_counts(acceptance: str, params: SamplingParams, draws: int, mask_rows: bool = True) -> np.ndarray:
    target = MockLM(salt=1)
    drafter = DraftModelDrafter(mock_loaded(MockLM(salt=2, sharpness=1.0), "mock-draft"), VOCAB)
    engine = SpeculativeEngine(target, drafter, FixedK(2), acceptance)
    counts = np.zeros(len(OUTCOMES))
    for seed in range(draws):
        generation = engine.start(PROMPT, params, StopCriteria(NEW_TOKENS), MockTokenizer(), seed,
                                  ToyConstraint(mask_rows))
        for _ in run_alone(generation):
            pass
        ids = generation.result().token_ids
        counts[ids[0] * 16 + ids[1] * 4 + ids[2]] += 1
    return counts


@pytest.mark.statistical
@pytest.mark.parametrize("acceptance", ["rejection", "match"])
def test_the_sampled_law_is_the_target_masked_by_the_grammar(acceptance):
    params = SamplingParams(temperature=1.0)
    assert_distribution(toy_counts(acceptance, params, 30_000), masked_law(MockLM(salt=1), params),
                        what=f"constrained sampling ({acceptance})")


@pytest.mark.statistical
def test_a_verifier_that_skips_the_mask_is_caught():
    params = SamplingParams(temperature=1.0)
    with pytest.raises(AssertionError):
        assert_distribution(toy_counts("rejection", params, 30_000, mask_rows=False),
                            masked_law(MockLM(salt=1), params), what="unmasked verification")


def test_forced_tokens_are_drafted_and_every_greedy_token_is_allowed():
    target = MockLM(salt=1)
    drafter = DraftModelDrafter(mock_loaded(MockLM(salt=2, sharpness=1.0), "mock-draft"), VOCAB)
    for seed in range(20):
        generation = SpeculativeEngine(target, drafter, FixedK(3)).start(
            PROMPT, SamplingParams(temperature=1.0), StopCriteria(12), MockTokenizer(), seed, ToyConstraint())
        list(run_alone(generation))
        ids = generation.result().token_ids
        assert all(token in allowed_after(tuple(ids[:i])) for i, token in enumerate(ids))


# -- real grammars (llguidance) on a tiny random model -------------------------------------------------
COMPACT = {"x-guidance": {"whitespace_flexible": False}}  # a random model would pad flexible whitespace
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "size": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["color", "size"], "additionalProperties": False, **COMPACT}


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    from specdec.models.sources.loading import load_model

    return load_model(str(tiny_dirs["llama"]))


@pytest.mark.parametrize("kind", [kind.name for kind in REGISTRY.values() if kind.test_spec])
def test_greedy_constrained_output_equals_plain_constrained_decoding(tiny, kind):
    spec = REGISTRY[kind].test_spec.format(target=tiny.path)
    grammar = GrammarSpec("json_schema", SCHEMA)
    prompt = "the color the size the color"
    plain = SpeculativeGenerator(tiny, None).generate(prompt, 40, chat=False, grammar=grammar)
    ours = SpeculativeGenerator(tiny, make_drafter(spec, tiny, "cpu", "float32"), 4).generate(
        prompt, 40, chat=False, grammar=grammar)
    assert ours.token_ids == plain.token_ids
    assert plain.finish_reason == "stop" and json.loads(plain.text)["color"] in ("red", "green", "blue")


def test_a_seed_gives_plain_constrained_sampling_text(tiny):
    grammar = GrammarSpec("regex", r"(ab|cd)+e")
    generator = SpeculativeGenerator(tiny, make_drafter("ngram", tiny, "cpu", "float32"), 4)
    for seed in range(4):
        plain = SpeculativeGenerator(tiny, None).generate("abab", 24, chat=False, grammar=grammar,
                                                          temperature=0.9, seed=seed)
        assert generator.generate("abab", 24, chat=False, grammar=grammar, temperature=0.9, seed=seed).token_ids \
            == plain.token_ids


@pytest.mark.parametrize("kind, source, message", [
    ("json_schema", {"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "json_schema"),
    ("json_schema", "[1, 2", "json_schema"),
    ("regex", "(unclosed", "regex"),
    ("lark", "start: (", "lark"),
    ("gbnf", "root ::= (", "gbnf"),
    ("gbnf", "root ::= missing", "gbnf"),
    ("yaml", "x", "unknown grammar kind"),
])
def test_a_bad_grammar_is_one_clear_error(kind, source, message):
    with pytest.raises(InvalidParameterError, match=message):
        GrammarSpec(kind, source)


@pytest.mark.slow
def test_outputs_of_the_real_model_match_their_schemas():
    """SmolLM2-135M, greedy with n-gram drafting, over schemas with nested objects, enums, arrays and
    patterns: every finished output validates (jsonschema), and equals plain constrained decoding."""
    import jsonschema

    generator = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", k=4)
    plain = SpeculativeGenerator(generator.target, None)
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
         "required": ["name", "age"], "additionalProperties": False},
        {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                          "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                          "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                   "maxItems": 3}},
         "required": ["city", "zip", "tags"], "additionalProperties": False},
        {"type": "object", "properties": {"person": {"type": "object", "properties": {
            "first": {"type": "string", "maxLength": 12}, "last": {"type": "string", "maxLength": 12}},
            "required": ["first", "last"], "additionalProperties": False},
            "language": {"enum": ["python", "rust", "go"]}},
         "required": ["person", "language"], "additionalProperties": False},
    ]
    for schema in schemas:
        grammar = GrammarSpec("json_schema", schema)
        prompt = f"Reply with a JSON object for this schema: {json.dumps(schema)}"
        ours = generator.generate(prompt, 120, grammar=grammar)
        assert ours.token_ids == plain.generate(prompt, 120, grammar=grammar).token_ids
        assert ours.finish_reason == "stop"
        jsonschema.validate(json.loads(ours.text), schema)
