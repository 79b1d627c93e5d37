"""Chunked prefill and the prefix cache: a prompt's keys and values, and so every token generated after it,
are bit-identical whether its prefill ran at once, in chunks, or after a prefix copied from another request."""

import pytest
import torch

import specdec.models.attention as attention
import specdec.models.llama as llama
from specdec.core.commit import StopCriteria
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import SpeculativeEngine, run_alone
from specdec.kernels import packed_kernel
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model
from specdec.api.prefix_cache import MIN_REUSED_TOKENS, PrefixCache
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import FixedK
from conftest import pulled_model_dir
from tiny_models import make_hf_model, save_tiny_model, write_tiny_gguf

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="chunk-invariant prefill runs on the CPU kernels")

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    llama_dir = save_tiny_model(root / "llama", "llama", seed=51)
    gguf = write_tiny_gguf(root / "q8.gguf", make_hf_model("llama", seed=52), "Q8_0")
    return {"llama": load_model(str(llama_dir)), "llama-int4": load_model(str(llama_dir), weights="int4"),
            "qwen2": load_model(str(save_tiny_model(root / "qwen2", "qwen2", seed=53))),
            "gguf-q8_0": load_model(str(gguf))}


@pytest.fixture
def small_limits(monkeypatch):
    """Shrink the prefill's row-attention limit, its blocks and the row-by-row forward size so a tiny model's
    short prompts cross them all: rows below the limit, aligned blocks above it, and row-by-row tail pieces."""
    monkeypatch.setattr(llama, "PREFILL_ROW_LIMIT", 24)
    monkeypatch.setattr(llama, "PREFILL_BLOCK", 12)
    monkeypatch.setattr(llama, "ROW_BY_ROW_MAX", 8)
    return 24


def random_tokens(model, length: int, seed: int) -> list[int]:
    return torch.randint(0, model.vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill(model, tokens: list[int], stops: list[int], hidden: tuple = ()):
    """The cache after prefilling `tokens`, in forwards that end at `stops`, and the last forward's output."""
    cache = model.new_cache(1, len(tokens) + 8)
    start, out, states = 0, None, []
    for stop in [*stops, len(tokens)]:
        chunk = torch.tensor([tokens[start:stop]])
        out = model.forward(chunk, positions_after(start, stop - start, 1, "cpu"), cache, hidden_layers=hidden)
        states.append(out.hidden_states.get(hidden[0]) if hidden else None)
        start = stop
    return cache, out, states


@pytest.mark.parametrize("name", ["llama", "llama-int4", "qwen2", "gguf-q8_0"])
def test_a_prefill_split_at_reusable_points_is_bit_identical_to_one_prefill(targets, small_limits, name):
    model = targets[name].model
    assert model.prefill_is_chunk_invariant
    # below the limit any point; above it, the limit plus multiples of the block; a last piece of more than 8 rows (90) and
    # of at most 8 (77: attending row by row, as a decoding step would)
    for length in (90, 77):
        tokens = random_tokens(model, length, seed=length)
        whole, whole_out, _ = prefill(model, tokens, [])
        for stops in ([5], [1, 2, 23], [24, 48], [17, 72], [72], [10, 48], [36, 60]):
            assert all(model.reusable_prefix(stop) == stop for stop in stops)
            cache, out, _ = prefill(model, tokens, stops)
            assert torch.equal(cache.keys[:, :, :, :length], whole.keys[:, :, :, :length]), stops
            assert torch.equal(cache.values[:, :, :, :length], whole.values[:, :, :, :length]), stops
            assert torch.equal(out.logits[0, -1], whole_out.logits[0, -1]), stops


def test_the_split_check_catches_a_prefill_that_depends_on_its_split(targets, small_limits, monkeypatch):
    """Control: torch's attention over each chunk (what a prefill ran before it was made chunk-invariant)
    rounds differently per split, and the comparison above sees it."""
    model = targets["llama-int4"].model
    monkeypatch.setattr(type(model), "prefill_is_chunk_invariant", property(lambda self: False))
    tokens = random_tokens(model, 90, seed=90)
    whole, _, _ = prefill(model, tokens, [])
    differ = [not torch.equal(prefill(model, tokens, stops)[0].keys[:, :, :, :90], whole.keys[:, :, :, :90])
              for stops in ([17, 72], [24, 48], [10, 48])]
    assert any(differ)


def test_reusable_points_and_the_hidden_states_of_a_split_prefill(targets, small_limits):
    model = targets["llama"].model
    assert [model.reusable_prefix(n) for n in (0, 7, 24, 25, 47, 48, 71)] == [0, 7, 24, 24, 36, 48, 60]
    # slots from decoding steps (rows attending alone) match a prefill's only below the limit
    assert model.reusable_prefix(60, prefilled=30) == 24 and model.reusable_prefix(20, prefilled=10) == 20
    assert model.reusable_prefix(70, prefilled=50) == 48
    tokens = random_tokens(model, 60, seed=2)
    _, _, whole = prefill(model, tokens, [], hidden=(1,))
    _, _, parts = prefill(model, tokens, [10, 24, 48], hidden=(1,))
    assert torch.equal(torch.cat(parts, dim=1), whole[0])  # a feature drafter gets the same prompt features


def test_a_sliding_window_or_int8_panels_have_no_reusable_points(tiny_dirs, tmp_path):
    gemma = load_model(str(tiny_dirs["gemma3"])).model
    int8 = load_model(str(tiny_dirs["llama"]), weights="int8").model
    for model in (gemma, int8):
        assert not model.prefill_is_chunk_invariant and model.reusable_prefix(10) == 0
        assert not PrefixCache(model, 1 << 20).enabled


def generate(model, prompt: list[int], max_new: int = 24, chunk: int | None = None, prompt_cache=None):
    """Greedy n-gram generation, prefilled in chunks of `chunk` tokens; its tokens and first round's logits."""
    engine = SpeculativeEngine(model, NgramDrafter(), FixedK(3))
    generation = engine.start(prompt, GREEDY, StopCriteria(max_new, frozenset()), _NoTokenizer())
    if prompt_cache is not None:
        generation.prefill.use_prompt_cache(prompt_cache)
    steps = 0
    while not generation.prefilled:
        generation.prefill_step(chunk)
        steps += 1
    first = generation.prepare_round()
    out = model.forward(first.request.tokens, first.request.positions, first.request.cache, first.request.attn_mask)
    generation.finish_round(first, out, 0.0)
    list(run_alone(generation))
    return generation.committer.token_ids, out.logits, steps, generation


class _NoTokenizer:
    def decode(self, ids, **kwargs):
        return ""


def test_chunked_prefill_and_a_prefix_hit_generate_what_one_prefill_generates(targets, small_limits):
    model = targets["llama-int4"].model
    system = random_tokens(model, 40, seed=3)
    prompt = system + random_tokens(model, 30, seed=4)
    tokens, logits, steps, _ = generate(model, prompt)
    assert steps == 1
    chunked, chunked_logits, steps, _ = generate(model, prompt, chunk=10)
    assert steps > 3 and chunked == tokens and torch.equal(chunked_logits, logits)

    cache = PrefixCache(model, 1 << 22)
    cache.store(system, prefill(model, system, [])[0])
    hit = cache.lookup(prompt[:-1])
    assert hit is not None and hit.length == 36  # the common 40 tokens, cut to the last reusable point
    reused, reused_logits, _, generation = generate(model, prompt, prompt_cache=hit)
    assert generation.prefill.reused_tokens == 36
    assert reused == tokens and torch.equal(reused_logits, logits)


def test_prefix_cache_keeps_copies_drops_extended_entries_and_evicts_least_recently_used(targets):
    model = targets["llama"].model
    per_token = model.new_cache(1, 1).nbytes
    cache = PrefixCache(model, per_token * 100)
    a = random_tokens(model, 40, seed=5)
    source, _, _ = prefill(model, a, [])
    cache.store(a[:20], source)
    cache.store(a, source)  # extends the first entry: it goes
    assert cache.stats.entries == 1 and cache.stats.bytes == 40 * per_token
    hit = cache.lookup(a + [1, 2])
    expected = source.keys[:, :, :, :40].clone()
    source.keys.zero_()  # the running request's cache changes; the entry is a copy
    assert hit.length == 40 and torch.equal(hit.keys[:, :, :, :40], expected)
    assert cache.lookup(random_tokens(model, 40, seed=6)) is None  # nothing shared
    assert cache.lookup(a[:MIN_REUSED_TOKENS - 1] + [0] * 20) is None  # too little shared
    b, c = random_tokens(model, 40, seed=7), random_tokens(model, 40, seed=8)
    cache.store(b, prefill(model, b, [])[0])
    cache.lookup(a)  # a is used again: b is now the least recently used
    cache.store(c, prefill(model, c, [])[0])  # 120 tokens > the budget of 100: one entry goes
    assert cache.stats.entries == 2 and cache.lookup(b) is None and cache.lookup(a) is not None
    assert (cache.stats.lookups, cache.stats.hits) == (6, 3)
    assert cache.tokens_held() == 100


def test_a_prompt_larger_than_the_whole_budget_keeps_its_longest_prefix_that_fits(targets):
    """Issue 90: a prompt over the budget was not kept at all (an agent's 11,666-token prompt against 512 MiB
    of the 1.5B's keys and values); its head is what the next turn shares, so that much is kept, and read."""
    model = targets["llama"].model
    per_token = model.new_cache(1, 1).nbytes
    cache = PrefixCache(model, per_token * 30)
    long = random_tokens(model, 50, seed=9)
    source, _, _ = prefill(model, long, [])
    cache.store(long, source)
    kept = model.reusable_prefix(30)
    assert cache.stats.entries == 1 and cache.stats.bytes == kept * per_token
    hit = cache.lookup(long + [3, 4])  # the next turn: the same prompt and more
    assert hit.length == kept and torch.equal(hit.keys[:, :, :, :kept], source.keys[:, :, :, :kept])


@pytest.mark.slow
def test_a_prefix_hit_on_the_real_model_in_int4_is_exact():
    """The real 135M model in int4 (int8 activations, as on GGUF blocks: last-bit differences would grow), a
    300-token prompt after a 200-token shared prefix: the same first logits and greedy tokens as a cold run."""
    model = load_model(str(pulled_model_dir("smollm2-135m-instruct")), weights="int4").model
    assert model.prefill_is_chunk_invariant
    shared = random_tokens(model, 200, seed=9)
    prompt = shared + random_tokens(model, 100, seed=10)
    cold, cold_logits, _, _ = generate(model, prompt, max_new=16)
    cache = PrefixCache(model, 1 << 28)
    cache.store(shared, prefill(model, shared, [])[0])
    warm, warm_logits, _, generation = generate(model, prompt, max_new=16, prompt_cache=cache.lookup(prompt[:-1]))
    assert generation.prefill.reused_tokens == 200
    assert warm == cold and torch.equal(warm_logits, cold_logits)


def test_a_prompt_rows_cost_grows_with_its_depth_by_the_models_shape(targets):
    """Chunked prefill sizes its steps by this: a row's attention over d keys against its weights' products."""
    from specdec.models.config import ModelConfig

    qwen_05b = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                           num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=32768,
                           model_type="qwen2", tie_word_embeddings=True, qkv_bias=True, o_bias=False, mlp_bias=False)
    # per layer 896 x (2 x 896 + 2 x 128) + 3 x 896 x 4864 weights, 2 multiply-adds each; attention 4 x 896 a key
    assert qwen_05b.attention_depth == 8320
    model = targets["llama"].model
    depth = model.config.attention_depth
    assert model.prompt_row_cost(0) == 1 and model.prompt_row_cost(int(depth)) == pytest.approx(2, rel=1e-3)


@pytest.mark.parametrize("name", ["llama", "gguf-q8_0"])
def test_prefill_blocks_take_the_block_kernel_close_to_torch_attention(targets, small_limits, monkeypatch, name):
    """Prefill blocks past the row limit attend through the block kernel (attention.CausalBlock,
    kernels/block_attention.cpp): the cache and logits agree with torch's grouped-query attention over the
    same blocks (its rounding, not its bits: the control shows the two paths really differ)."""
    model = targets[name].model
    assert attention.CausalBlock.applies(model.model.norm.weight, model.config.head_dim)
    tokens = random_tokens(model, 90, seed=7)
    blocked, blocked_out, _ = prefill(model, tokens, [36])
    monkeypatch.setattr(attention.CausalBlock, "applies", staticmethod(lambda x, head_dim: False))
    torch_path, torch_out, _ = prefill(model, tokens, [36])
    assert torch.allclose(blocked.keys[:, :, :, :90], torch_path.keys[:, :, :, :90], atol=1e-4, rtol=1e-4)
    assert torch.allclose(blocked_out.logits, torch_out.logits, atol=1e-3, rtol=1e-3)
    assert not torch.equal(blocked.keys[:, :, :, :90], torch_path.keys[:, :, :, :90])


def test_prefill_blocks_layer_by_layer_take_the_block_kernel_split_invariantly(targets, small_limits, monkeypatch):
    """Architectures the layer plan has no step for (Gemma's norms, GELU) run their layers one by one: their
    prefill blocks take the block kernel through CausalBlock.attend, split or whole alike, close to torch's."""
    model = targets["llama"].model
    monkeypatch.setattr(type(model), "layer_plan", lambda self, *args: None)
    tokens = random_tokens(model, 90, seed=7)
    whole, whole_out, _ = prefill(model, tokens, [])
    split, split_out, _ = prefill(model, tokens, [36, 48])
    assert torch.equal(whole.keys[:, :, :, :90], split.keys[:, :, :, :90])
    assert torch.equal(whole_out.logits[:, -1], split_out.logits[:, -1])
    monkeypatch.setattr(attention.CausalBlock, "applies", staticmethod(lambda x, head_dim: False))
    torch_path, _, _ = prefill(model, tokens, [])
    assert torch.allclose(whole.keys[:, :, :, :90], torch_path.keys[:, :, :, :90], atol=1e-4, rtol=1e-4)
    assert not torch.equal(whole.keys[:, :, :, :90], torch_path.keys[:, :, :, :90])


def test_a_long_prompt_through_the_block_kernel_generates_plain_decodings_text_streamed_and_whole(targets,
                                                                                                  small_limits,
                                                                                                  monkeypatch):
    """The user's calls: a prompt past the row limit (its blocks through the block kernel), generated whole and
    streamed with n-gram speculation, gives plain decoding's tokens, chunked prefill included."""
    from specdec import SpeculativeGenerator

    target = targets["llama"]
    prompt = "the cache keeps every key and value of the prompt " * 6
    assert len(target.tokenizer.encode(prompt)) > small_limits + 2 * llama.PREFILL_BLOCK
    taken = []
    applies = attention.CausalBlock.applies
    monkeypatch.setattr(attention.CausalBlock, "applies", staticmethod(lambda *args: taken.append(1) or applies(*args)))
    plain = SpeculativeGenerator(target, None).generate(prompt, 24, chat=False)
    assert taken  # the prompt's blocks past the limit went to the block kernel
    speculative = SpeculativeGenerator(target, NgramDrafter(), 4)
    whole = speculative.generate(prompt, 24, chat=False)
    streamed = list(speculative.stream(prompt, 24, chat=False))
    assert whole.token_ids == plain.token_ids and len(plain.token_ids) == 24
    assert [t for chunk in streamed for t in chunk.token_ids] == plain.token_ids
    assert "".join(chunk.text for chunk in streamed) == plain.text
