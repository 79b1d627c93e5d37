"""The commit step trims an accepted block at EOS, stop strings and max_new_tokens; text, ids and chunks agree."""

import pytest

from specdec.core.commit import Committer, StopCriteria
from specdec.errors import InvalidParameterError
from tiny_models import make_tokenizer

TOKENIZER = make_tokenizer()
EOS = TOKENIZER.eos_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def run(blocks, criteria):
    committer = Committer(TOKENIZER, criteria)
    chunks = []
    for block in blocks:
        outcome = committer.commit(block)
        chunks.append(outcome.text_chunk)
        if outcome.finish_reason:
            break
    return committer, "".join(chunks)


def test_eos_inside_a_block():
    block = ids("abc") + [EOS] + ids("zzz")
    committer, streamed = run([block], StopCriteria(50, frozenset({EOS})))
    assert committer.token_ids == ids("abc") and committer.text == "abc" == streamed
    assert committer.finish_reason == "stop"


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_stop_string_inside_and_across_blocks(split):
    tokens = ids("one two STOP three")
    blocks = [tokens[i:i + split] for i in range(0, len(tokens), split)]
    committer, streamed = run(blocks, StopCriteria(50, frozenset({EOS}), ("STOP",)))
    assert committer.text == "one two " == streamed
    assert committer.finish_reason == "stop"
    # the ids end with the token that completes the stop string, whatever the block split
    assert TOKENIZER.decode(committer.token_ids) == "one two STOP"


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_max_new_tokens_exact(max_new):
    tokens = ids("abcdefghij")
    committer, streamed = run([tokens[:4], tokens[4:]], StopCriteria(max_new, frozenset({EOS})))
    assert committer.token_ids == tokens[:max_new]
    assert committer.finish_reason == "length"
    assert committer.text == streamed == TOKENIZER.decode(tokens[:max_new])


def test_partial_utf8_is_held_back():
    tokens = ids("é!")  # 'é' is two byte tokens
    committer = Committer(TOKENIZER, StopCriteria(10, frozenset({EOS})))
    first = committer.commit(tokens[:1]).text_chunk
    rest = committer.commit(tokens[1:]).text_chunk
    assert first == "" and rest == "é!"


def test_bad_criteria():
    with pytest.raises(InvalidParameterError):
        StopCriteria(0)
    with pytest.raises(InvalidParameterError):
        StopCriteria(5, stop_strings=("",))
