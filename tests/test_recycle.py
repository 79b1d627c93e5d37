"""Token Recycling (drafters/recycle.py, issue 76): the table the target's verify rows fill, the chain and tree
it drafts, its sharing across requests, and exactness end to end: greedy and seeded text equal plain
decoding's, alone, combined with lookup, under a grammar and through the server. (The registry's test spec
also runs it through every drafter's greedy, seeded and structured-output tests; tests/test_loop_distribution.py
checks the sampled law of its chains and trees.)"""

from __future__ import annotations

import json

import pytest
import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.api.structured import GrammarSpec
from specdec.core.sampling import SamplingParams
from specdec.drafters.recycle import RecycleDrafter, RecycleOptions, SuccessorTable
from specdec.drafters.registry import make_drafter, parse_spec
from specdec.errors import InvalidParameterError
from test_server import RunningServer

PROMPTS = ["the cat sat on the mat and the cat", "one two three four one two three", "hello world"]


def rows(*tops: list[int], width: int = 10) -> torch.Tensor:
    """Logits (R, width) whose r-th row ranks tops[r] first, in order."""
    out = torch.zeros(len(tops), width)
    for row, order in enumerate(tops):
        for rank, token in enumerate(order):
            out[row, token] = 10.0 - rank
    return out


def test_the_table_keeps_each_tokens_latest_successors_and_walks_them():
    table = SuccessorTable(successors=2)
    assert table.following(3, 2) == []  # nothing seen yet
    table.update([3, 5, 3], rows([4, 1], [6, 2], [7, 8]))  # token 3's last row wins
    assert table.following(3, 2) == [7, 8] and table.following(5, 1) == [6]
    drafter = RecycleDrafter(RecycleOptions(successors=2), table)
    table.update([7, 8], rows([5, 9], [1, 2]))
    assert drafter.propose([0, 3], 3, SamplingParams(), None).tokens == [7, 5, 6]  # 3 -> 7 -> 5 -> 6
    assert drafter.propose([0, 3], 10, SamplingParams(), None).tokens == [7, 5, 6]  # 6 has no successors yet
    tree = RecycleDrafter(RecycleOptions(successors=2, shape="tree", width=2, levels=1), table)
    draft = tree.propose([0, 3], 4, SamplingParams(), None)
    assert draft.tokens == [7, 8, 5, 1] and draft.parents == [-1, -1, 0, 1]  # two branches, then top-1 each


def test_options_are_checked_when_the_spec_is_parsed():
    assert parse_spec("recycle@shape=tree,width=3,successors=4").options == RecycleOptions(4, "tree", 3)
    for bad in ("recycle@shape=forest", "recycle@width=9", "recycle@successors=0", "recycle@shared=2",
                "recycle@depth=2"):
        with pytest.raises(InvalidParameterError):
            parse_spec(bad)


def test_a_shared_table_serves_every_fresh_copy_and_an_unshared_one_starts_empty():
    shared = RecycleDrafter(RecycleOptions(shared=1))
    shared.take_logits([1], rows([2]))
    copy = shared.fresh()
    copy.begin([1], SamplingParams(), 10)
    assert copy.propose([1], 1, SamplingParams(), None).tokens == [2]
    alone = RecycleDrafter(RecycleOptions(shared=0))
    alone.take_logits([1], rows([2]))
    alone.begin([1], SamplingParams(), 10)
    assert alone.propose([1], 1, SamplingParams(), None).tokens == []


@pytest.mark.parametrize("spec", ["recycle", "recycle@shape=tree,width=2,levels=2", "ngram+recycle",
                                  "recycle@shared=0"])
def test_recycled_drafts_give_plain_decodings_text_greedy_and_seeded(tiny_generator, spec):
    target = tiny_generator.target
    plain = SpeculativeGenerator(target, None)
    drafter = make_drafter(spec, target, "cpu", "float32")
    generator = SpeculativeGenerator(target, drafter, "auto")
    accepted = 0
    for prompt in PROMPTS * 2:  # the second pass drafts from a table the first one filled
        for settings in ({}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}):
            result = generator.generate(prompt, 40, chat=False, **settings)
            assert result.token_ids == plain.generate(prompt, 40, chat=False, **settings).token_ids, (spec, prompt)
            accepted += result.stats.accepted
    assert accepted > 0  # the table drafted, and verification kept some


def test_recycled_drafts_under_a_grammar_are_exact(tiny_generator):
    target = tiny_generator.target
    generator = SpeculativeGenerator(target, make_drafter("recycle", target, "cpu", "float32"), 4)
    grammar = GrammarSpec("regex", r"(the|cat|sat|on|mat)( (the|cat|sat|on|mat)){3,12}")
    for seed in (None, 5):
        params = SamplingParams(temperature=0.0 if seed is None else 0.9)
        request = GenerationRequest("the cat sat on", 40, params, seed=seed, chat=False, grammar=grammar)
        assert generator.run(request).token_ids == generator.run(request.replace(speculative=False)).token_ids


def test_the_server_shares_one_table_across_requests_and_answers_as_plain(tiny_generator):
    target = tiny_generator.target
    running = RunningServer(SpeculativeGenerator(target, make_drafter("recycle", target, "cpu", "float32"), 4))
    try:
        body = {"prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0}
        texts = []
        for stream in (False, True, False):
            if stream:
                chunks = running.client.completions.create(model="tiny", stream=True, **body)
                texts.append("".join(chunk.choices[0].text for chunk in chunks if chunk.choices))
            else:
                status, text = running.request("POST", "/v1/completions", json.dumps(body))
                texts.append(json.loads(text)["choices"][0]["text"])
        plain = SpeculativeGenerator(target, None).generate(PROMPTS[0], 30, chat=False).text
        assert texts[0] == texts[1] == texts[2] == plain
        assert running.generator.drafter.table.next is not None  # the requests' rows filled the shared table
    finally:
        running.stop()


def test_specdec_generate_with_recycle_gives_plain_decodings_tokens(tiny_dirs, capsys):
    from specdec.cli import main

    outputs = {}
    for drafter in ("none", "recycle"):
        assert main(["generate", PROMPTS[0], "--target", str(tiny_dirs["llama"]), "--drafter", drafter, "--no-chat",
                     "--max-new-tokens", "24", "--json"]) == 0
        outputs[drafter] = json.loads(capsys.readouterr().out)
    assert outputs["recycle"]["token_ids"] == outputs["none"]["token_ids"]
    assert outputs["recycle"]["stats"]["drafter"].startswith("recycle")
