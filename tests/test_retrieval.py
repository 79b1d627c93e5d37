"""Retrieval drafting: the suffix-array datastore against brute force, the drafter's trees, greedy
equality through the engine, the CLI and its errors."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from specdec.heads.datastore import Datastore, build_datastore
from specdec.errors import InvalidParameterError
from specdec.api.generator import SpeculativeGenerator
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams
from specdec.core.tree import TokenTree
from tiny_models import make_tokenizer, save_tiny_model


def indexed(tokens: list[int], separator: int = 99) -> Datastore:
    from pydivsufsort import divsufsort

    array = np.asarray(tokens, dtype=np.int32)
    return Datastore(array, divsufsort(array.astype(np.uint32)).astype(np.int64), {"separator": separator})


def test_occurrences_and_continuations_match_brute_force():
    rng = random.Random(0)
    tokens = [rng.randrange(5) for _ in range(3000)]
    tokens[1500] = 99  # a document boundary
    store = indexed(tokens)
    for _ in range(200):
        size = rng.randint(1, 5)
        pattern = [rng.randrange(5) for _ in range(size)]
        expected = sorted(i for i in range(len(tokens) - size + 1) if tokens[i: i + size] == pattern)
        assert sorted(store.occurrences(np.asarray(pattern, dtype=np.int32), 10**6).tolist()) == expected
    context = tokens[1490:1500]  # ends right before the boundary
    found = store.continuations(context, 8, 2, 10**6, 4)
    assert found and all(99 not in c and 1 <= len(c) <= 4 for c in found)
    assert store.continuations([7, 7, 7], 3, 2, 10, 4) == []  # tokens never seen


def test_drafter_tree_holds_the_most_frequent_continuations():
    from specdec.drafters.retrieval import RetrievalDrafter

    corpus = [1, 2, 3, 4, 5, 99, 1, 2, 3, 4, 6, 99, 1, 2, 3, 4, 5, 99, 1, 2, 3, 7, 99]
    drafter = RetrievalDrafter(indexed(corpus), "retrieval:test", budget=4, depth=3)
    # after "2 3" came "4 5", "4 6", "4 5", "7" (cut at document ends): counts 4:3, 4 5:2, 4 6:1, 7:1
    def paths(budget):
        draft = drafter.propose([9, 2, 3], budget, SamplingParams(), None)
        tree = TokenTree.from_draft(draft.tokens, draft.parents)
        return {tuple(draft.tokens[n] for n in path) for path in tree.paths()}

    assert paths(4) == {(4, 5), (4, 6), (7,)}
    assert paths(2) == {(4, 5)}
    assert paths(1) == {(4,)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval")
    return {"dir": save_tiny_model(root / "target", "llama", seed=31), "root": root}


def test_greedy_equality_and_acceptance_with_a_datastore_of_the_targets_own_text(tiny):
    """The datastore holds the target's own greedy continuations (as token ids: a random byte-level model's
    text does not survive decoding), so retrieval drafts are accepted; output stays plain decoding's."""
    from specdec.drafters.retrieval import RetrievalDrafter

    target = load_model(str(tiny["dir"]))
    plain = SpeculativeGenerator(target, None)
    prompts = ["hello hello the world", "in the beginning", "x"]
    corpus: list[int] = []
    for prompt in prompts:
        corpus += plain.encode(prompt, chat=False) + plain.generate(prompt, 60, chat=False).token_ids + [263]
    drafter = RetrievalDrafter(indexed(corpus, separator=263), "retrieval:own", budget=8, depth=6)
    for prompt in prompts + ["the world in hello"]:
        spec = SpeculativeGenerator(target, drafter, k="auto").generate(prompt, 60, chat=False)
        assert spec.token_ids == plain.generate(prompt, 60, chat=False).token_ids
    assert SpeculativeGenerator(target, drafter, k="auto").generate(prompts[0], 60, chat=False).stats.tau > 3


def test_datastore_of_another_tokenizer_is_refused(tmp_path):
    tokenizer = make_tokenizer()
    (tmp_path / "a.txt").write_text("hello world " * 20)
    build_datastore([tmp_path / "a.txt"], tokenizer, 263, tmp_path / "store", "tiny", progress=False)
    info = json.loads((tmp_path / "store" / "datastore.json").read_text())
    info["tokenizer_sha256"] = "0" * 64
    (tmp_path / "store" / "datastore.json").write_text(json.dumps(info))
    with pytest.raises(InvalidParameterError, match="tokenizer"):
        Datastore.open(tmp_path / "store", tokenizer)


def test_cli_build_then_generate_and_errors(tiny, tmp_path):
    cli = [sys.executable, "-m", "specdec.cli"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.py").write_text("def hello():\n    return 'hello world'\n" * 10)
    build = subprocess.run(cli + ["datastore", "build", str(tmp_path / "docs"), "--target", str(tiny["dir"]),
                                  "--out", str(tmp_path / "store")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-1500:]
    gen = subprocess.run(cli + ["generate", "def hello", "--no-chat", "--target", str(tiny["dir"]), "--drafter",
                                f"retrieval:{tmp_path / 'store'}", "--max-new-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr[-1500:]
    for args, message in [(["datastore", "build", str(tmp_path / "nothing"), "--target", str(tiny["dir"]), "--out",
                            str(tmp_path / "s2")], "no such file"),
                          (["generate", "x", "--no-chat", "--target", str(tiny["dir"]), "--drafter",
                            f"retrieval:{tmp_path / 'docs'}"], "not a datastore")]:
        run = subprocess.run(cli + args, capture_output=True, text=True, timeout=300)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "s2").exists() and not (tmp_path / ".s2.partial").exists()
