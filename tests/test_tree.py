"""Token trees and tree verification: structure checked by brute force on random trees, greedy tree
verification through the engine equal to plain decoding, and multi-draft rejection sampling following
the target's distribution (with a broken variant that must fail)."""

import itertools
import random

import numpy as np
import pytest
import torch

from mock_models import MockLM, MockTokenizer
from specdec.core import verify
from specdec.core.commit import StopCriteria
from specdec.engine import SpeculativeEngine
from specdec.api.generator import SpeculativeGenerator
from specdec.core.speculation_length import KSetting
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams, processed_probs
from specdec.core.tree import ROOT, TokenTree
from stats_checks import assert_distribution
from tiny_models import save_tiny_model
from tree_drafters import OracleTreeDrafter, RandomTreeDrafter


def random_tree(rng: random.Random, size: int, vocab: int = 5) -> TokenTree:
    parents = [rng.randrange(-1, node) for node in range(size)]
    return TokenTree(tuple(rng.randrange(vocab) for _ in range(size)), tuple(parents))


def distinct_sibling_tree(rng: random.Random, size: int, vocab: int) -> TokenTree:
    """A random tree whose siblings carry different tokens (as a drafter proposes them)."""
    tokens, parents = [], []
    for _ in range(size):
        parent = rng.randrange(-1, len(tokens))
        used = {tokens[s] for s in range(len(tokens)) if parents[s] == parent}
        free = [t for t in range(vocab) if t not in used]
        if free:
            tokens.append(rng.choice(free))
            parents.append(parent)
    return TokenTree(tuple(tokens), tuple(parents))


@pytest.mark.parametrize("seed", range(20))
def test_structure_matches_brute_force(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randint(1, 12))

    def is_ancestor_or_self(a, b):  # is a on b's path from the root?
        while b != ROOT:
            if a == b:
                return True
            b = tree.parents[b]
        return False

    mask = tree.ancestor_mask()
    for i, j in itertools.product(range(len(tree)), repeat=2):
        assert bool(mask[i, j]) == is_ancestor_or_self(j, i)
    for node in range(len(tree)):
        assert tree.depths[node] == len(tree.ancestors(node))
        assert [n for n in range(len(tree)) if tree.parents[n] == node] == list(tree.children[node])
    leaves = [n for n in range(len(tree)) if node_is_leaf(tree, n)]
    assert [path[-1] for path in tree.paths()] == leaves
    rebuilt = TokenTree.from_paths([[tree.tokens[n] for n in path] for path in tree.paths()])
    assert node_prefixes(rebuilt) == node_prefixes(tree)  # the same token paths, siblings merged
    assert len(rebuilt) == len(node_prefixes(tree))


def node_is_leaf(tree, node):
    return node not in tree.parents


def node_prefixes(tree):
    return {tuple(tree.tokens[n] for n in tree.ancestors(node)) for node in range(len(tree))}


def test_from_paths_merges_prefixes_and_rejects_bad_parents():
    tree = TokenTree.from_paths([[1, 2, 3], [1, 2, 4], [1, 5], [6]])
    assert tree.tokens == (1, 2, 3, 4, 5, 6) and tree.parents == (-1, 0, 1, 1, 0, -1)
    assert tree.depths == (1, 2, 3, 3, 2, 1)
    tokens, positions, mask = tree.verify_inputs(root_token=9, root_position=40)
    assert tokens.tolist() == [[9, 1, 2, 3, 4, 5, 6]] and positions.tolist() == [[40, 41, 42, 43, 43, 42, 41]]
    assert mask[:, 0].all() and mask[4].tolist() == [True, True, True, False, True, False, False]
    with pytest.raises(ValueError):
        TokenTree((1, 2), (-1, 1))  # a node cannot be its own parent


@pytest.mark.parametrize("seed", range(10))
def test_greedy_tree_verification_is_the_longest_argmax_path(seed):
    rng = random.Random(seed)
    tree = distinct_sibling_tree(rng, 14, vocab=3)
    logits = torch.randn(len(tree) + 1, 3, generator=torch.Generator().manual_seed(seed))
    result = verify.verify_tree_greedy(logits, tree)
    best = logits.argmax(-1).tolist()
    # brute force over every node: its path is acceptable when each token on it is the argmax of the
    # row before it; the accepted path is the deepest acceptable one (unique: siblings differ)
    acceptable = [path for path in (tree.ancestors(n) for n in range(len(tree)))
                  if all(tree.tokens[n] == best[([ROOT] + path)[i] + 1] for i, n in enumerate(path))]
    expected = max(acceptable, key=len, default=[])
    assert result.accepted_path == expected
    node = expected[-1] if expected else ROOT
    assert result.tokens == [tree.tokens[n] for n in expected] + [best[node + 1]]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return load_model(str(save_tiny_model(tmp_path_factory.mktemp("tree") / "t", "qwen2", seed=21)))


@pytest.mark.parametrize("k", [3, 6, 10])
def test_greedy_tree_drafting_equals_plain_decoding(tiny_target, k):
    for prompt in ["hello hello the world", "in the beginning", "x"]:
        plain = SpeculativeGenerator(tiny_target, None).generate(prompt, 40, chat=False).token_ids
        prompt_ids = SpeculativeGenerator(tiny_target, None).encode(prompt, chat=False)
        drafter = OracleTreeDrafter(plain, len(prompt_ids), tiny_target.model.vocab_size, seed=k)
        result = SpeculativeGenerator(tiny_target, drafter, k).generate(prompt, 40, chat=False)
        assert result.token_ids == plain
        assert result.stats.accepted > 0 and result.stats.rounds < len(plain)  # the trees were used


# -- sampling ----------------------------------------------------------------------------------
PROMPT = [1, 2, 1]
VOCAB = 4


def joint_law(target: MockLM, params: SamplingParams, length: int) -> np.ndarray:
    law = []
    for outcome in itertools.product(range(VOCAB), repeat=length):
        prob, prefix = 1.0, tuple(PROMPT)
        for token in outcome:
            prob *= float(processed_probs(target.logits_after(prefix).unsqueeze(0), params, torch.tensor(prefix))[0, token])
            prefix += (token,)
        law.append(prob)
    return np.array(law)


def _count(args) -> np.ndarray:
    drafter, params, seeds, length = args
    torch.set_num_threads(1)
    # the rejection rule: multi-draft residuals are what can go wrong (under the match rule the text is plain
    # sampling's, checked token for token in test_seeded_sampling)
    engine = SpeculativeEngine(MockLM(salt=1), drafter, KSetting.parse(8).new_length(), "rejection")
    counts = np.zeros(VOCAB**length)
    for seed in seeds:
        ids = engine.generate(PROMPT, params, StopCriteria(length), MockTokenizer(), seed=seed).token_ids
        counts[sum(t * VOCAB ** (length - 1 - i) for i, t in enumerate(ids))] += 1
    return counts


def count_through_engine(drafter, params, n, length=3):
    """n generations (seeds 0..n-1) split over two forked processes (CI has 2 cores)."""
    import multiprocessing

    halves = [(drafter, params, range(0, n // 2), length), (drafter, params, range(n // 2, n), length)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(_count, halves)), MockLM(salt=1)


TREE_CONFIGS = [
    ("top-k siblings", (3, 2), False, SamplingParams(temperature=1.0)),
    ("sampled siblings", (3, 2), True, SamplingParams(temperature=1.0)),
    ("sampled, top-p and penalty", (2, 2, 2), True, SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2)),
]


@pytest.mark.statistical
@pytest.mark.parametrize("name,branching,sampled,params", TREE_CONFIGS, ids=[c[0] for c in TREE_CONFIGS])
def test_tree_sampling_follows_the_target_distribution(name, branching, sampled, params):
    draft = MockLM(salt=2, sharpness=1.0)
    counts, target = count_through_engine(RandomTreeDrafter(draft.logits_after, branching, sampled), params, 24_000)
    assert_distribution(counts, joint_law(target, params, 3), tv_bound=0.01, what=name)


@pytest.mark.statistical
def test_tree_sampling_without_the_sibling_residual_update_fails(monkeypatch):
    """Trying the next sibling against the unchanged target distribution over-weights sibling tokens."""
    monkeypatch.setattr(verify, "residual_distribution", lambda target, draft: target)
    draft = MockLM(salt=2, sharpness=1.0)
    params = SamplingParams(temperature=1.0)
    counts, target = count_through_engine(RandomTreeDrafter(draft.logits_after, (3, 2), False), params, 20_000)
    with pytest.raises(AssertionError):
        assert_distribution(counts, joint_law(target, params, 3))
