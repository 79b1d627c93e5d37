"""Drafts remembered across generations (`ngram@memory=TOKENS`): bounded, exact counts, and output equal to
plain decoding (greedy, and seeded sampling under the match rule) while it drafts from earlier outputs."""

from __future__ import annotations

from collections import Counter

import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.drafters import make_drafter
from specdec.core.sampling import SamplingParams
from specdec.drafters.continuation_memory import ContinuationMemory
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import load_model
from tiny_models import save_tiny_model


def recount(memory: ContinuationMemory) -> dict:
    counts: dict = {}
    for sequence, tokens in memory.sequences.items():
        for end in range(memory.lead_ins[sequence], len(tokens)):
            for n in range(2, memory.order + 1):
                if end - n >= 0:
                    counts.setdefault(tuple(tokens[end - n:end]), Counter())[tokens[end]] += 1
    return counts


def test_memory_stays_within_its_bound_and_its_counts_match_what_it_holds():
    memory = ContinuationMemory(max_tokens=50, order=3)
    for generation in range(12):
        sequence = memory.start()
        for chunk in range(3):
            memory.extend(sequence, [(generation * 7 + chunk * 3 + i) % 11 for i in range(5)])
            assert memory.held == sum(len(t) for t in memory.sequences.values()) <= 50
            assert memory.counts == recount(memory)
    assert len(memory.sequences) < 12  # the oldest were forgotten
    alone = memory.start()
    memory.extend(alone, list(range(80)))  # one generation longer than the bound: kept up to it
    assert memory.held == 50 and memory.counts == recount(memory)
    led = memory.start([90, 91, 92, 93, 94])  # a prompt's lead-in makes room for itself and is held
    assert memory.sequences[led] == [92, 93, 94] and memory.held <= 50 and memory.counts == recount(memory)


def test_memory_proposes_the_most_frequent_continuation():
    memory = ContinuationMemory(max_tokens=1000)
    for tail in ([5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9, 9]):
        memory.extend(memory.start(), [1, 2, *tail])
    assert memory.propose([40, 1, 2, 5, 6], 3) == ([7, 8], 4)  # 7 seen twice after (.., 5, 6), 9 once
    assert memory.propose([40, 41], 3) == ([], 0)


def test_a_prompt_ending_like_an_earlier_one_is_drafted_from_that_answer():
    """The lead-in: the prompt's last tokens key the answer's first tokens and are never proposed."""
    drafter = NgramDrafter(max_ngram=3, memory=ContinuationMemory(max_tokens=1000, order=3))
    earlier = drafter.fresh()
    earlier.begin([7, 8, 9, 10, 11], SamplingParams())
    earlier.propose([7, 8, 9, 10, 11, 20, 21, 22, 23], 4, SamplingParams(), None)  # committed so far
    later = drafter.fresh()
    later.begin([1, 2, 9, 10, 11], SamplingParams())  # a new prompt with the same ending
    assert later.propose([1, 2, 9, 10, 11], 3, SamplingParams(), None).tokens == [20, 21, 22]
    assert later.propose([1, 2, 9, 10, 11, 20], 8, SamplingParams(), None).tokens == [21, 22, 23]
    assert drafter.memory.propose([5, 9, 10], 4) == ([], 0)  # the lead-in is never a continuation


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(str(save_tiny_model(tmp_path_factory.mktemp("memory") / "target", "qwen2", seed=11)))


def test_a_drafter_with_memory_equals_plain_decoding_and_remembers_each_prompts_ending(target):
    drafter = make_drafter("ngram@memory=4096", target, "cpu", "float32")
    assert drafter.name == "ngram@memory=4096"
    plain = SpeculativeGenerator(target, None)
    speculative = SpeculativeGenerator(target, drafter, "auto")
    prompts = ["the quick brown fox", "a b c d", "the quick brown fox", "once upon a time", "a b c d"]
    for index, prompt in enumerate(prompts):
        for seed, temperature in ((None, 0.0), (100 + index, 0.8)):
            expected = plain.generate(prompt, 24, chat=False, seed=seed, temperature=temperature).token_ids
            got = speculative.generate(prompt, 24, chat=False, seed=seed, temperature=temperature).token_ids
            assert got == expected, (prompt, temperature)
        # Whatever the model says, a repeated prompt's ending now keys what followed it before.
        assert drafter.memory.propose(target.tokenizer.encode(prompt), 4)[0]
    assert drafter.fresh().memory is drafter.memory  # a server's concurrent requests share one memory
    assert drafter.memory.held <= 4096


def test_memory_option_is_checked_before_loading(target):
    with pytest.raises(InvalidParameterError, match="memory"):
        make_drafter("ngram@memory=0", target, "cpu", "float32")
