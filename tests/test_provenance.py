"""Each streamed token's provenance (core/rounds.RoundProvenance): one origin per committed token, the draft
tokens counted as the round's statistics count accepted ones, the source naming which part of a combined
drafter proposed, and the tokens those of plain decoding."""

import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.api.structured import GrammarSpec
from specdec.core.rounds import ORIGINS
from specdec.drafters import make_drafter
from specdec.models.sources.loading import load_model
from tiny_models import save_tiny_model

PROMPT = "hello hello the world hello hello the world"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(str(save_tiny_model(tmp_path_factory.mktemp("provenance") / "t", "qwen2", seed=11)))


@pytest.mark.parametrize("drafter, sources", [
    ("ngram", {"ngram"}),
    ("quant:int8", {"quant:int8"}),
    ("ngram+quant:int8", {"ngram", "quant:int8"}),
])
def test_provenance_agrees_with_the_stats_and_plain_decoding(target, drafter, sources):
    generator = SpeculativeGenerator(target, make_drafter(drafter, target, "cpu", "float32"), k="auto")
    plain = SpeculativeGenerator(target, None).generate(PROMPT, 40, chat=False).token_ids
    chunks = list(generator.stream(PROMPT, 40, chat=False))
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    assert tokens == plain
    rounds = [chunk.provenance for chunk in chunks]
    assert all(len(r.origins) == len(chunk.token_ids) for r, chunk in zip(rounds, chunks))
    assert all(set(r.origins) <= set(ORIGINS) for r in rounds)
    for r in rounds[:-1]:  # only the last round can be cut (the length limit)
        assert r.accepted_committed == r.accepted <= r.drafted
        assert r.origins[-1] == ("target" if r.drafted == 0 else "recovered" if r.accepted < r.drafted else "bonus")
    assert sum(r.accepted_committed for r in rounds) <= sum(r.accepted for r in rounds)
    drafted = [r for r in rounds if r.drafted]
    assert drafted and {r.source for r in drafted} <= {source for source in sources}
    assert any(r.accepted for r in drafted), "some draft tokens were accepted"
    assert all(r.source is None for r in rounds if not r.drafted)
    assert all(r.verify_ms > 0 for r in rounds)


def test_the_stats_of_the_whole_generation_count_what_provenance_counts(target):
    generator = SpeculativeGenerator(target, make_drafter("ngram", target, "cpu", "float32"), k=4)
    chunks = []
    result = generator.generate(PROMPT, 30, chat=False, on_chunk=chunks.append)
    assert sum(chunk.provenance.accepted for chunk in chunks) == result.stats.accepted
    assert sum(chunk.provenance.drafted for chunk in chunks) == result.stats.drafted
    assert sum(len(chunk.provenance.origins) for chunk in chunks) == len(result.token_ids)


def test_grammar_forced_tokens_are_marked_forced(target):
    generator = SpeculativeGenerator(target, make_drafter("ngram", target, "cpu", "float32"), k=4)
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    chunks = list(generator.stream(PROMPT, 30, chat=False, grammar=GrammarSpec("json_schema", schema)))
    origins = [origin for chunk in chunks for origin in chunk.provenance.origins]
    assert "forced" in origins and {r.source for c in chunks if (r := c.provenance).origins[0] == "forced"} == {
        "grammar"}
