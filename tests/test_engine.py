"""The speculative engine: greedy equality with plain decoding for every drafter and K,
the commit step inside accepted blocks, cache invariants, seeding, draft vocabularies."""

import pytest
import torch

from specdec.core.commit import StopCriteria
from specdec.core.rounds import Draft, VerifyResult
from specdec.drafters import REGISTRY, make_drafter
from specdec.drafters.base import Drafter
from specdec.drafters.combined import CombinedDrafter, LookupSource
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import SpeculativeEngine
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.api.generator import SpeculativeGenerator
from specdec.core.speculation_length import KSetting
from specdec.kernels import packed_kernel
from specdec.models.base import positions_after
from specdec.models.derived import head_prefix_copy, layer_subset_copy
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams
from tiny_models import save_tiny_model

KS = [1, 2, 3, 4, 5, 6, 7, 8, "auto", "auto:3"]
PROMPTS = ["hello hello the world", "in the beginning", "x"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    return {
        "target": load_model(str(save_tiny_model(root / "target", "qwen2", seed=11))),
        # a different random model with the same tokenizer: low acceptance, still exact
        "random_draft": load_model(str(save_tiny_model(root / "draft", "qwen2", seed=12, num_hidden_layers=1))),
        # padded to a larger vocabulary, as Qwen2.5 checkpoints of different sizes are
        "padded_draft": load_model(str(save_tiny_model(root / "padded", "llama", seed=13, vocab_size=280))),
        # sliding-window layers (a window of 8, crossed within every generation), Gemma's norms and GELU
        "gemma3": load_model(str(save_tiny_model(root / "gemma3", "gemma3", seed=11))),
    }


def plain_ids(target, prompt: str, max_new: int, params=SamplingParams(), seed=None, stop=()) -> list[int]:
    gen = SpeculativeGenerator(target, None)
    return gen.generate(prompt, max_new, chat=False, seed=seed, stop=stop, temperature=params.temperature).token_ids


def drafters(models):
    return {
        "ngram": lambda: NgramDrafter(),
        "draft-random": lambda: DraftModelDrafter(models["random_draft"], models["target"].model.vocab_size),
        "draft-self": lambda: DraftModelDrafter(models["target"], models["target"].model.vocab_size),
        "draft-padded-vocab": lambda: DraftModelDrafter(models["padded_draft"], models["target"].model.vocab_size),
        "draft-early-exit": lambda: DraftModelDrafter(models["random_draft"], models["target"].model.vocab_size, 0.5),
        # the target drafting for itself over token ids < 128 only (a cheaper draft head)
        "draft-head-prefix": lambda: make_drafter(f"draft:{models['target'].path}@vocab=128", models["target"], "cpu",
                                                  "float32"),
        "quant-int8": lambda: make_drafter("quant:int8", models["target"], "cpu", "float32"),
        "quant-int4": lambda: make_drafter("quant:int4", models["target"], "cpu", "float32"),
        # a self-draft that prefills only the prompt's last 3 tokens, with a head over ids < 128
        "quant-int4-window": lambda: make_drafter("quant:int4@context=3,vocab=128", models["target"], "cpu", "float32"),
        # the target itself as an int4 draft model (weights=FORMAT: not the target's float32)
        "draft-int4-weights": lambda: make_drafter(f"draft:{models['target'].path}@weights=int4", models["target"],
                                                   "cpu", "float32"),
        "draft-prompt-window": lambda: make_drafter(f"draft:{models['target'].path}@context=2", models["target"], "cpu",
                                                    "float32"),
        # a window of 6 whose first proposal prefills only the last 2 tokens (start=N)
        "draft-start-window": lambda: make_drafter(f"draft:{models['target'].path}@context=6,start=2",
                                                   models["target"], "cpu", "float32"),
        "layerskip": lambda: make_drafter("layerskip:first:1", models["target"], "cpu", "float32"),
    }


needs_kernel = pytest.mark.skipif(packed_kernel() is None, reason="low-bit weights need the CPU kernel (AVX2, g++)")
ALL_DRAFTERS = ["ngram", "draft-random", "draft-self", "draft-padded-vocab", "draft-early-exit", "draft-head-prefix",
                "draft-prompt-window", "draft-start-window", pytest.param("quant-int8", marks=needs_kernel),
                pytest.param("quant-int4", marks=needs_kernel), pytest.param("quant-int4-window", marks=needs_kernel),
                pytest.param("draft-int4-weights", marks=needs_kernel),
                "layerskip"]


@pytest.mark.parametrize("drafter", ALL_DRAFTERS)
@pytest.mark.parametrize("k", KS)
def test_greedy_output_equals_plain_decoding(models, drafter, k):
    target = models["target"]
    for prompt in PROMPTS:
        expected = plain_ids(target, prompt, 40)
        gen = SpeculativeGenerator(target, drafters(models)[drafter](), k)
        result = gen.generate(prompt, 40, chat=False)
        assert result.token_ids == expected, f"{drafter} K={k} prompt={prompt!r}"
        stats = result.stats
        assert stats.new_tokens == len(expected) and stats.rounds >= 1
        assert stats.tau == pytest.approx((stats.accepted + stats.rounds) / stats.rounds)
        assert stats.tau >= len(expected) / stats.rounds  # trimming at the end can only drop tokens


@needs_kernel
@pytest.mark.parametrize("weights", ["int8", "int4", "int4:64", "int7"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_low_bit_target_speculative_equals_its_own_plain_decoding(models, weights, k, tmp_path):
    target = load_model(str(models["target"].path), weights=weights)
    assert target.model.lm_head.weight_format == ("int7" if weights.startswith("int4") else weights)
    assert target.model.model.layers[0].mlp.down_proj.weight_format == weights
    for prompt in PROMPTS:
        expected = plain_ids(target, prompt, 40)
        for drafter in (NgramDrafter(), DraftModelDrafter(target, target.model.vocab_size),
                        DraftModelDrafter(models["target"], target.model.vocab_size)):
            result = SpeculativeGenerator(target, drafter, k).generate(prompt, 40, chat=False)
            assert result.token_ids == expected, f"{drafter.name} K={k} prompt={prompt!r}"


@needs_kernel
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16])
def test_a_two_byte_kv_cache_keeps_speculative_output_equal_to_plain_decoding_with_it(models, kv_dtype):
    """Keys and values are rounded once, as they are written: plain and speculative decoding read the same
    stored values, so their outputs stay equal; the cache takes half float32's memory."""
    name = str(kv_dtype).removeprefix("torch.")
    target = load_model(str(models["target"].path), weights="int4", kv_dtype=name)
    cache = target.model.new_cache(1, 16)
    assert cache.keys.dtype == kv_dtype and 2 * cache.nbytes == models["target"].model.new_cache(1, 16).nbytes
    for prompt in PROMPTS:
        expected = plain_ids(target, prompt, 40)
        for drafter in (NgramDrafter(), DraftModelDrafter(models["target"], target.model.vocab_size)):
            result = SpeculativeGenerator(target, drafter, 4).generate(prompt, 40, chat=False)
            assert result.token_ids == expected, f"{drafter.name} prompt={prompt!r}"


@needs_kernel
def test_quant_drafter_is_close_to_its_target_and_shares_what_it_can(models):
    drafter = make_drafter("quant:int8", models["target"], "cpu", "float32")
    target, draft = models["target"].model, drafter.model
    assert drafter.name == "quant:int8" and draft.lm_head.weight_format == "int8"
    assert target.lm_head.weight_format == "float32"  # the target is untouched
    assert draft.model.norm.weight is target.model.norm.weight  # norms are shared, not copied
    result = SpeculativeGenerator(models["target"], drafter, 4).generate(PROMPTS[0], 40, chat=False)
    assert result.stats.acceptance_rate > 0.8  # int8 weights barely move the tiny model's argmax
    with pytest.raises(SpecdecError, match="unknown weight format"):
        make_drafter("quant:int3", models["target"], "cpu", "float32")
    with pytest.raises(SpecdecError, match="group size 96 must be a multiple of 32 dividing"):
        make_drafter("quant:int4:96", models["target"], "cpu", "float32")
    int4 = make_drafter("quant:int4", models["target"], "cpu", "float32")
    assert int4.model.model.layers[0].self_attn.qkv_proj.weight_format == "int4"
    assert int4.model.lm_head.weight_format == "int7" and target.lm_head.weight_format == "float32"
    int8_target = load_model(str(models["target"].path), weights="int8")
    with pytest.raises(SpecdecError, match="already has int8 weights"):
        make_drafter("quant:int8", int8_target, "cpu", "float32")
    with pytest.raises(SpecdecError, match="needs the native backend"):
        make_drafter("quant:int8", load_model(str(models["target"].path), backend="transformers"), "cpu", "float32")


def test_layer_skip_draft_shares_weights_and_runs_only_its_layers(models):
    from specdec.drafters.self_draft import parse_layer_subset

    target = models["target"].model
    tokens = torch.tensor([[5, 9, 13, 2]])
    positions = positions_after(0, 4, 1, tokens.device)
    same = layer_subset_copy(target, [0, 1])  # every layer: must be the target exactly
    assert torch.equal(same.forward(tokens, positions, same.new_cache(1, 8)).logits,
                       target.forward(tokens, positions, target.new_cache(1, 8)).logits)
    first = layer_subset_copy(target, [0])
    assert first.num_layers == 1 and target.num_layers == 2 and first.new_cache(1, 8).keys.shape[0] == 1
    assert first.model.layers[0] is target.model.layers[0] and first.lm_head is target.lm_head
    assert not torch.equal(first.forward(tokens, positions, first.new_cache(1, 8)).logits,
                           target.forward(tokens, positions, target.new_cache(1, 8)).logits)
    assert parse_layer_subset("every:3", 10) == [0, 3, 6, 9]
    assert parse_layer_subset("first:4", 30) == [0, 1, 2, 3]
    assert parse_layer_subset("0-2,8-9", 10) == [0, 1, 2, 8, 9]
    for bad in ("first:0", "every:0", "0-40", "x", "0-9"):
        with pytest.raises(SpecdecError, match="layerskip"):
            parse_layer_subset(bad, 10)


@needs_kernel
def test_stats_report_each_drafters_memory_and_cost_per_round(models):
    """Memory a drafter adds beyond the target: a draft model its weights + KV cache; a self-draft only
    what it does not share (layer-skip: its KV cache alone; int4: the quantized matrices); n-gram its index."""
    from specdec.drafters.base import module_bytes

    target = models["target"]
    weights = module_bytes(target.model)
    cache_bytes = lambda drafter: drafter.cache.keys.nbytes + drafter.cache.values.nbytes  # noqa: E731
    figures = {}
    made = {"ngram": drafters(models)["ngram"], "draft-random": drafters(models)["draft-random"],
            **{spec: lambda spec=spec: make_drafter(spec, target, "cpu", "float32")
               for spec in ("quant:int4", "layerskip:first:1")}}
    for spec, make in made.items():
        drafter = make()
        stats = SpeculativeGenerator(target, drafter, 3).generate(PROMPTS[0], 20, chat=False).stats
        assert stats.drafter_memory_bytes == drafter.memory_bytes() > 0
        assert stats.draft_ms_per_round > 0 and stats.verify_ms_per_round > 0
        assert stats.verify_ms_per_round == pytest.approx(1e3 * stats.verify_seconds / stats.rounds)
        figures[spec] = (stats.drafter_memory_bytes, drafter)
    assert figures["layerskip:first:1"][0] == cache_bytes(figures["layerskip:first:1"][1])  # no weights
    int4_bytes, int4 = figures["quant:int4"]
    assert cache_bytes(int4) < int4_bytes < cache_bytes(int4) + weights / 2  # 4-bit layers, 7-bit head
    draft_bytes, draft = figures["draft-random"]
    assert draft_bytes == module_bytes(models["random_draft"].model) + cache_bytes(draft)
    assert figures["ngram"][0] < 1e6


def test_draft_equal_to_target_accepts_nearly_everything(models):
    target = models["target"]
    gen = SpeculativeGenerator(target, DraftModelDrafter(target, target.model.vocab_size), 4)
    stats = gen.generate("hello the", 60, chat=False).stats
    assert stats.acceptance_rate > 0.95
    assert stats.tau > 4.0


@pytest.mark.parametrize("k", [1, 3, 8, "auto"])
@pytest.mark.parametrize("max_new", [1, 2, 3, 17])
def test_max_new_tokens_exact(models, k, max_new):
    target = models["target"]
    gen = SpeculativeGenerator(target, DraftModelDrafter(target, target.model.vocab_size), k)
    result = gen.generate("hello", max_new, chat=False)
    assert result.token_ids == plain_ids(target, "hello", max_new)
    assert len(result.token_ids) == max_new and result.finish_reason == "length"


@pytest.mark.parametrize("k", [2, 5, 8])
def test_eos_inside_an_accepted_block(models, k):
    target = models["target"]
    full = plain_ids(target, "hello", 30)
    eos = full[10]  # pretend the 11th greedy token is EOS: it arrives inside a block of accepted drafts
    first = full.index(eos)
    drafter = DraftModelDrafter(target, target.model.vocab_size)
    engine = SpeculativeEngine(target.model, drafter, KSetting.parse(k).new_length())
    chunks = []
    result = engine.generate(target.tokenizer.encode("hello"), SamplingParams(),
                             StopCriteria(30, frozenset({eos})), target.tokenizer, on_chunk=chunks.append)
    assert result.token_ids == full[:first] and result.finish_reason == "stop"
    assert "".join(c.text for c in chunks) == result.text
    assert [t for c in chunks for t in c.token_ids] == result.token_ids
    assert result.stats.new_tokens == len(result.token_ids)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_stop_string_inside_an_accepted_block(models, k):
    target = models["target"]
    plain = SpeculativeGenerator(target, None).generate("hello", 30, chat=False)
    stop = plain.text[12:15]
    expected = SpeculativeGenerator(target, None).generate("hello", 30, chat=False, stop=stop)
    gen = SpeculativeGenerator(target, DraftModelDrafter(target, target.model.vocab_size), k)
    streamed = list(gen.stream("hello", 30, chat=False, stop=stop))
    result = gen.generate("hello", 30, chat=False, stop=stop)
    assert result.text == expected.text == plain.text[: plain.text.index(stop)]
    assert result.token_ids == expected.token_ids
    assert "".join(c.text for c in streamed) == result.text
    assert result.finish_reason == "stop"


def test_caches_hold_committed_tokens_after_every_round(models, monkeypatch):
    """Invariant 2: after each round the target's cache holds every committed token but the last
    (the next round's input) and the drafter's a prefix of them, each equal to a fresh prefill."""
    import specdec.engine as engine_module

    target, draft = models["target"], models["random_draft"]
    target_caches = []
    original_init = engine_module.Generation.__init__

    def capture(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        target_caches.append(self.cache)

    monkeypatch.setattr(engine_module.Generation, "__init__", capture)
    checked_rounds = []

    class CheckingDrafter(DraftModelDrafter):
        def on_verified(self, context, draft_, result):
            super().on_verified(context, draft_, result)
            assert target_caches[0].length == len(context) - 1
            assert self.cache.length <= len(context) - 1
            for model, cache in [(self.model, self.cache), (target.model, target_caches[0])]:
                n = cache.length
                fresh = model.new_cache(1, 128)
                model.forward(torch.tensor([context[:n]]), positions_after(0, n, 1, "cpu"), fresh)
                assert torch.allclose(cache.keys[:, :, :, :n], fresh.keys[:, :, :, :n], atol=1e-5)
            checked_rounds.append(result.num_accepted)

    SpeculativeGenerator(target, CheckingDrafter(draft, target.model.vocab_size), 4).generate("hello the", 25, chat=False)
    assert len(checked_rounds) > 3


# Not "auto": there K follows measured timings, so a seed reproduces the distribution, not the sample.
@pytest.mark.parametrize("k", [1, 3])
def test_seeded_sampling_repeats(models, k):
    target = models["target"]
    gen = SpeculativeGenerator(target, DraftModelDrafter(models["random_draft"], target.model.vocab_size), k)
    runs = [gen.generate("hello", 25, chat=False, temperature=0.9, top_p=0.95, seed=7).token_ids for _ in range(2)]
    other = gen.generate("hello", 25, chat=False, temperature=0.9, top_p=0.95, seed=8).token_ids
    assert runs[0] == runs[1]
    assert other != runs[0]


def test_ngram_drafter_proposes_the_continuation_of_the_latest_match():
    drafter = NgramDrafter(max_ngram=3)
    drafter.begin([], SamplingParams(), 0)
    context = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
    assert drafter.propose(context, 3, SamplingParams(), None).tokens == [9, 2, 5]
    assert drafter.propose([1, 2, 3], 3, SamplingParams(), None).tokens == []


@pytest.mark.parametrize("k", [3, "auto"])
def test_combined_drafter_equals_plain_and_drafts_from_each_source(models, k):
    target = models["target"]
    # a window of 2 tokens: the model restarts from the context's last 2 after lookup drafted a longer run
    spec = f"ngram+draft:{target.path}@weights=float32,context=2"
    proposed = {"ngram": 0, f"draft:{target.path}@weights=float32,context=2": 0}
    kinds: set = set()
    restarts = 0
    for prompt in PROMPTS:
        drafter = make_drafter(spec, target, "cpu", "float32")
        drafter.model_after_tokens = 0  # 40 tokens: the model drafts from the first
        model = drafter.sources[1]
        unseen = model._unseen

        def counting_restarts(context, unseen=unseen, model=model):
            nonlocal restarts
            skipped = model.skipped
            pending = unseen(context)
            restarts += model.skipped != skipped
            return pending
        model._unseen = counting_restarts

        def counting(source, propose):
            def wrapped(*args):
                draft = propose(*args)
                proposed[source.name] += bool(len(draft))
                return draft
            return wrapped
        for source in drafter.sources:
            source.propose = counting(source, source.propose)
        generator = SpeculativeGenerator(target, drafter, k)
        result = generator.generate(prompt, 40, chat=False)
        assert result.token_ids == plain_ids(target, prompt, 40), f"{spec} K={k} prompt={prompt!r}"
        assert drafter.name == spec
        if k == "auto":  # each kind of source drafts to its own K
            kinds |= set(generator.engine.speculation.lengths)
    assert all(proposed.values()), proposed
    if k == 3:  # (with K auto the model's own K falls to 0 on these prompts and it never lags past the window)
        assert restarts, "no catch-up past the window: the restart went untested"
    if k == "auto":
        assert (1, "draft") in kinds and kinds & {(0, "verbatim"), (0, "guess")}, kinds


def test_combined_drafter_with_its_default_wait_equals_plain_whole_and_streamed(models):
    """As `auto` builds it (no model before MODEL_AFTER_TOKENS): the output is plain decoding's, and the
    model first drafts once that many tokens are committed."""
    from specdec.drafters.combined import MODEL_AFTER_TOKENS

    target = models["target"]
    new_tokens = MODEL_AFTER_TOKENS + 32  # past the lookup's verbatim copies of this repetitive text
    drafter = make_drafter(f"ngram+draft:{target.path}@weights=float32", target, "cpu", "float32")
    model = drafter.sources[1]
    asked_at: list[int] = []
    propose = model.propose

    def recording(context, *args):
        asked_at.append(len(context))
        return propose(context, *args)
    model.propose = recording
    gen = SpeculativeGenerator(target, drafter, "auto")
    prompt = PROMPTS[1]
    prompt_length = len(target.tokenizer.encode(prompt, add_special_tokens=True))
    result = gen.generate(prompt, new_tokens, chat=False)
    assert result.token_ids == plain_ids(target, prompt, new_tokens)
    assert asked_at and min(asked_at) - prompt_length >= MODEL_AFTER_TOKENS, (asked_at, prompt_length)
    streamed = list(gen.stream(prompt, new_tokens, chat=False))
    assert [t for chunk in streamed for t in chunk.token_ids] == result.token_ids
    assert "".join(chunk.text for chunk in streamed) == result.text


class FixedSource(Drafter):
    """A chain drafter that always proposes the same tokens (a combined drafter's source)."""

    def __init__(self, name, tokens):
        self.name, self.tokens = name, tokens

    def begin(self, prompt_ids, params, max_length):
        pass

    def propose(self, context, max_tokens, params, noise):
        return Draft.chain(self.tokens[:max_tokens])

    def on_verified(self, context, draft, result):
        pass

    def fresh(self):
        return self


class FixedLookup(FixedSource, LookupSource):
    verbatim = True

    def proposal_is_verbatim(self):
        return self.verbatim


def combined(*sources):
    """The model asked from the first token: these rounds test how the sources are judged."""
    return CombinedDrafter(list(sources), model_after_tokens=0)


def test_combined_drafter_passes_over_a_source_a_later_one_outpaces():
    from specdec.drafters.combined import RATED_AFTER, RETRY_EVERY, Throughput

    def measured(drafter, rates, modelless=None):
        """Each source's tokens per second as if measured over enough rounds (None: not yet)."""
        def throughput(rate):
            return Throughput() if rate is None else Throughput(tokens=rate, seconds=1.0, rounds=RATED_AFTER)
        drafter.throughputs, drafter.modelless = [throughput(r) for r in rates], throughput(modelless)

    drafter = combined(FixedSource("lookup", [70, 50]), FixedSource("model", [1, 2]))
    drafter.begin([50, 60], SamplingParams(), 64)
    assert drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [70, 50]  # unmeasured: cheapest first
    measured(drafter, [10.0, 40.0], 1.0)  # tokens/s of the rounds each source drafted
    chosen = [drafter.propose([50, 60], 2, SamplingParams(), None).tokens[0] for _ in range(2 * RETRY_EVERY)]
    assert chosen.count(70) == 2 and chosen.count(1) == 2 * RETRY_EVERY - 2  # retried every RETRY_EVERY rounds
    measured(drafter, [50.0, 40.0], 1.0)
    assert drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [70, 50]

    # a free lookup is always asked, and a verbatim copy is taken whatever the rates say
    lookup = FixedLookup("lookup", [70, 50])
    drafter = combined(lookup, FixedSource("model", [1, 2]))
    drafter.begin([50, 60], SamplingParams(), 64)
    measured(drafter, [10.0, 40.0])
    assert all(drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [70, 50] for _ in range(RETRY_EVERY))
    lookup.verbatim = False  # a weak guess gives way to the model ...
    measured(drafter, [None, None])
    assert drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [1, 2]
    measured(drafter, [None, 30.0], 20.0)
    assert drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [1, 2]
    measured(drafter, [None, 5.0], 30.0)  # ... unless the model sits the round out
    drafts = [drafter.propose([50, 60], 2, SamplingParams(), None).tokens for _ in range(2 * RETRY_EVERY)]
    assert drafts.count([70, 50]) == 2 * RETRY_EVERY - 2 and drafts.count([1, 2]) == 2

    # the model is passed over where rounds without a draft commit faster
    drafter = combined(FixedSource("lookup", []), FixedSource("model", [1, 2]))
    drafter.begin([50, 60], SamplingParams(), 64)
    measured(drafter, [None, 5.0], 20.0)
    drafts = [drafter.propose([50, 60], 2, SamplingParams(), None).tokens for _ in range(2 * RETRY_EVERY)]
    assert drafts.count([]) == 2 * RETRY_EVERY - 2 and drafts.count([1, 2]) == 2
    drafter.begin([50, 60], SamplingParams(), 64)  # no round without a draft measured yet: one now and then
    measured(drafter, [None, 5.0])
    drafts = [drafter.propose([50, 60], 2, SamplingParams(), None).tokens for _ in range(2 * RETRY_EVERY)]
    assert drafts.count([]) == 2


def test_with_k_auto_a_model_is_judged_by_its_predicted_rate_against_this_rounds_alternative():
    """K auto: each source's AdaptiveK predicts its tokens per second at its best K; the model drafts where
    that beats lookup's weak guess (when lookup has one this round) or else a plain step, and a model passed
    over is retried every RETRY_EVERY rounds."""
    from specdec.core.speculation_length import SourceLengths
    from specdec.drafters.combined import RETRY_EVERY

    def judged(model_accepts: int, guess: list[int], guess_accepts: int | None = None) -> list[int | None]:
        """Who drafted each of 2 * RETRY_EVERY rounds once measured: 1 the model, 70 lookup, None nobody."""
        lengths = SourceLengths(4)
        lookup = FixedLookup("lookup", guess)
        lookup.verbatim = False  # weak guesses only
        drafter = combined(lookup, FixedSource("model", [1, 2]))
        drafter.use_source_lengths(lengths)
        drafter.begin([50, 60], SamplingParams(), 64)
        assert drafter.propose([50, 60], 2, SamplingParams(), None).tokens == [1, 2]  # unmeasured: it drafts
        lengths.observe(0, 0, 0.0, 0.040)  # a plain step: 40 ms
        for _ in range(8):  # its rounds: two draft tokens of 5 ms, verified in 42 ms
            lengths.next_k_for((1, "draft"), min_k=1)
            lengths.observe(2, model_accepts, 0.010, 0.042, source=(1, "draft"))
            if guess_accepts is not None:  # lookup's guesses cost nothing to draft
                lengths.next_k_for((0, "guess"))
                lengths.observe(2, guess_accepts, 0.0, 0.042, source=(0, "guess"))
        assert lengths.predicted_rate((1, "draft")) is not None
        drafts = [drafter.propose([50, 60], 2, SamplingParams(), None).tokens for _ in range(2 * RETRY_EVERY)]
        return [draft[0] if draft else None for draft in drafts]

    rounds = 2 * RETRY_EVERY
    assert judged(2, [70, 50], guess_accepts=0) == [1] * rounds  # agreeing: it beats a guess and a plain step
    plain = judged(0, [])  # rejected every time: a plain step commits faster
    assert plain.count(None) == rounds - 2 and plain.count(1) == 2
    guessed = judged(0, [70, 50])  # lookup's guess is this round's alternative
    assert guessed.count(70) == rounds - 2 and guessed.count(1) == 2
    assert judged(1, []) == [1] * rounds  # half agreeing beats a plain step ...
    assert judged(1, [70, 50], guess_accepts=2).count(70) == rounds - 2  # ... but not a guess always accepted


def test_no_model_is_asked_before_the_first_tokens_unless_nothing_else_drafts():
    """A draft model's first proposal prefills its window, which a short answer never earns back: lookup
    drafts the first `model_after_tokens` alone, unless there is no lookup to draft them."""

    class Asked(Drafter):
        def __init__(self, name):
            self.name, self.asked = name, 0

        def begin(self, prompt_ids, params, max_length):
            pass

        def propose(self, context, max_tokens, params, noise):
            self.asked += 1
            return Draft.chain([1])

        def on_verified(self, context, draft, result):
            pass

        def fresh(self):
            return self

    class Lookup(Asked, LookupSource):
        pass

    lookup, model = Lookup("lookup"), Asked("model")
    drafter = CombinedDrafter([lookup, model], model_after_tokens=3)
    drafter.begin([7, 8], SamplingParams(), 64)
    assert [drafter.propose([7, 8, *range(n)], 1, SamplingParams(), None).tokens for n in range(5)] == [[1]] * 5
    assert (lookup.asked, model.asked) == (5, 2)  # asked once 3 tokens are committed
    models_only = CombinedDrafter([Asked("quant"), model], model_after_tokens=3)
    models_only.begin([7, 8], SamplingParams(), 64)
    models_only.propose([7, 8], 1, SamplingParams(), None)
    assert model.asked == 2 and models_only.sources[0].asked == 1


def test_a_draft_models_catch_up_is_not_counted_against_its_round():
    """Catching up on what other sources committed is the price of the rounds the model sat out: counted
    in its own round, a model tried now and then looked slower than plain steps and sat out ever more."""
    import time

    from specdec.drafters.combined import RATED_AFTER
    from specdec.drafters.ngram import NgramDrafter

    class CatchingUp(Drafter):  # a draft model, tried after the lookup finds nothing
        name = "catching-up"

        def begin(self, prompt_ids, params, max_length):
            pass

        def on_verified(self, context, draft, result):
            pass

        def fresh(self):
            return self

        def propose(self, context, max_tokens, params, noise):
            time.sleep(0.2)  # a prefill of the tokens it skipped
            self.catch_up_seconds = 0.2
            return Draft.chain([1, 2])

    drafter = CombinedDrafter([NgramDrafter(), CatchingUp()], model_after_tokens=0)
    drafter.begin([50, 60], SamplingParams(), 64)
    for _ in range(1 + RATED_AFTER):  # the first round of a source is cold and not rated
        draft = drafter.propose([50, 60], 2, SamplingParams(), None)
        drafter.on_verified([50, 60, 1, 2, 3], draft, VerifyResult(2, [0, 1], [1, 2, 3]))
    assert drafter.throughputs[1].rate > 3 / 0.2 * 5  # three tokens in far less than the catch-up took


def test_a_sources_rate_is_its_tokens_over_its_seconds_and_waits_for_a_few_rounds():
    """One round's yield swings from one token to K + 1: a model judged on one unlucky round sat out most
    of a short answer."""
    from specdec.drafters.combined import RATE_DECAY, RATED_AFTER, Throughput

    throughput = Throughput()
    rounds = [(1, 0.05), (4, 0.06), (1, 0.05)][:RATED_AFTER]
    for tokens, seconds in rounds[:-1]:
        throughput.add(tokens, seconds)
        assert throughput.rate is None
    throughput.add(*rounds[-1])
    weights = [RATE_DECAY ** (len(rounds) - 1 - i) for i in range(len(rounds))]
    expected = sum(w * t for w, (t, _) in zip(weights, rounds)) / sum(w * s for w, (_, s) in zip(weights, rounds))
    assert throughput.rate == pytest.approx(expected)


def test_combined_drafter_refuses_tree_drafters_and_none(models):
    with pytest.raises(InvalidParameterError, match="chain drafters"):
        make_drafter("ngram+lookahead", models["target"], "cpu", "float32")
    with pytest.raises(InvalidParameterError, match="cannot be combined"):
        make_drafter("ngram+none", models["target"], "cpu", "float32")


def test_ngram_drafter_stops_before_control_tokens_and_drops_refuted_matches():

    drafter = NgramDrafter(max_ngram=2, never_propose=frozenset({99}))
    drafter.begin([], SamplingParams(), 0)
    # a chat-like prompt: after "4 5" the template continued with control token 99
    context = [4, 5, 6, 99, 7, 3, 4, 5]
    assert drafter.propose(context, 4, SamplingParams(), None).tokens == [6]
    context = [4, 5, 99, 7, 1, 4, 5]  # nothing before the control token: no draft from that match
    drafter.begin([], SamplingParams(), 0)
    assert drafter.propose(context, 4, SamplingParams(), None).tokens == []
    # a match whose first token the target rejected is not proposed again; a shorter n-gram may be
    drafter = NgramDrafter(max_ngram=2)
    drafter.begin([], SamplingParams(), 0)
    context = [8, 5, 2, 3, 1, 5, 6, 4, 5]
    draft = drafter.propose(context, 2, SamplingParams(), None)
    assert draft.tokens == [6, 4]  # "5" most recently continued with 6 ("4 5" has no earlier match)
    drafter.on_verified(context + [9], draft, VerifyResult(2, [], [9]))
    assert drafter.propose(context + [9, 4, 5], 2, SamplingParams(), None).tokens == [9, 4]  # newer occurrence
    drafter.begin([], SamplingParams(), 0)
    drafter.propose(context, 2, SamplingParams(), None)
    drafter.on_verified(context, draft, VerifyResult(2, [], [9]))
    assert drafter.propose(context, 2, SamplingParams(), None).tokens == []  # refuted, nothing shorter left


def test_loaded_models_name_their_control_tokens(models):
    target = models["target"]
    im_start = target.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start in target.control_token_ids()
    assert not target.control_token_ids() & set(target.eos_token_ids)


@pytest.mark.parametrize("weights,kernels", [("float32", False), ("float32", True), ("int8", True), ("int4", True),
                                             ("int7", True)])
def test_head_prefix_copy_computes_the_first_logits_exactly(models, weights, kernels):
    if kernels and packed_kernel() is None:
        pytest.skip("needs the CPU kernel")
    full = load_model(str(models["target"].path), weights=weights, kernels=kernels).model
    prefix = head_prefix_copy(full, 112)
    tokens = torch.tensor([[5, 77, 200, 31, 9]])

    def logits(model):
        return model.forward(tokens, positions_after(0, 5, 1, "cpu"), model.new_cache(1, 8)).logits

    assert torch.equal(logits(prefix), logits(full)[..., :112])
    assert full.lm_head.out_features == full.vocab_size  # the original keeps its whole head


def test_draft_vocab_option_errors_are_clear(models):
    target = models["target"]
    for spec, message in [(f"draft:{target.path}@vocab=100", "multiple of 16"),
                          (f"draft:{target.path}@vocab=x", "not a whole number"),
                          (f"draft:{target.path}@size=3", "unknown option"),
                          (f"draft:{target.path}@confidence=2", r"\[0, 1\)"),
                          (f"draft:{target.path}@context=0", "N >= 1"),
                          (f"draft:{target.path}@start=0", "N >= 1"),
                          ("quant:int4@context=x", "not a whole number"),
                          (f"draft:{target.path}@weights=int5", "unknown weight format"),
                          ("quant:int4@weights=int8", "unknown option")]:
        with pytest.raises(SpecdecError, match=message):
            make_drafter(spec, target, "cpu", "float32")
    assert make_drafter(f"draft:{target.path}@0.25", target, "cpu", "float32").min_confidence == 0.25


def test_prompt_window_prefills_only_the_last_tokens(models):
    """context=N: the draft's cache holds the prompt's last N tokens at their true positions, prefilled by
    the first proposal (not by `begin`: combined with lookup, a draft may never be asked); drafting then
    runs on from there, and a catch-up longer than N restarts from the context's last N tokens."""
    target = models["target"]
    drafter = make_drafter(f"draft:{target.path}@context=4", target, "cpu", "float32")
    prompt = list(range(5, 25))
    drafter.begin(prompt, SamplingParams(), 64)
    assert (drafter.skipped, drafter.cache.length) == (16, 0)
    draft = drafter.propose(prompt, 3, SamplingParams(), None)
    assert len(draft.tokens) == 3 and drafter.cache.length == 4 + 2  # the window, 2 drafts (the last is not fed)
    drafter.on_verified(prompt, draft, VerifyResult(3, [], [7]))  # none accepted: the window stays
    assert drafter.cache.length == 4
    # asked again 7 committed tokens later (another source drafted them): more than the window to catch up
    # on, so it restarts from the context's last 4 tokens, at their true positions
    context = prompt + [7, 8, 9, 10, 11, 12, 13]
    draft = drafter.propose(context, 3, SamplingParams(), None)
    assert (drafter.skipped, drafter.cache.length) == (len(context) - 4, 4 + 2)
    fresh = make_drafter(f"draft:{target.path}@context=4", target, "cpu", "float32")
    fresh.begin(context, SamplingParams(), 64)  # the same 4 tokens as a prompt's window: the same draft
    assert fresh.propose(context, 3, SamplingParams(), None).tokens == draft.tokens


def test_start_window_prefills_only_the_last_tokens_at_the_first_proposal(models):
    """start=N: the first proposal prefills only the context's last N tokens (a draft behind lookup is first
    asked some way into the answer); every token after that stays in the draft's cache, and a restart (a
    catch-up longer than context=N) takes the full window again. With start=N alone the first proposal
    prefills N tokens of a whole prompt, and the draft then keeps all it sees."""
    target = models["target"]
    drafter = make_drafter(f"draft:{target.path}@context=8,start=3", target, "cpu", "float32")
    prompt = list(range(5, 25))
    drafter.begin(prompt, SamplingParams(), 64)
    context = prompt + [7, 8]  # lookup drafted the first two tokens of the answer
    draft = drafter.propose(context, 3, SamplingParams(), None)
    assert (drafter.skipped, drafter.cache.length) == (len(context) - 3, 3 + 2)  # 3 tokens at their positions
    fresh = make_drafter(f"draft:{target.path}@context=3", target, "cpu", "float32")
    fresh.begin(context, SamplingParams(), 64)  # the same 3 tokens as a prompt's window: the same draft
    assert fresh.propose(context, 3, SamplingParams(), None).tokens == draft.tokens
    drafter.on_verified(context, draft, VerifyResult(3, [0], [draft.tokens[0], 9]))  # one accepted, then 9
    context = context + [draft.tokens[0], 9]
    draft = drafter.propose(context, 2, SamplingParams(), None)
    assert drafter.cache.length == 3 + 1 + 1 + 1  # it kept its start and fed only the new token, then a draft
    drafter.on_verified(context, draft, VerifyResult(2, [], [4]))
    context = context + [4] + list(range(30, 40))  # sat out 11 tokens: more than the window of 8
    drafter.propose(context, 2, SamplingParams(), None)
    assert (drafter.skipped, drafter.cache.length) == (len(context) - 8, 8 + 1)  # a restart takes the window
    alone = make_drafter(f"draft:{target.path}@start=4", target, "cpu", "float32")
    alone.begin(prompt, SamplingParams(), 64)
    alone.propose(prompt, 2, SamplingParams(), None)
    assert (alone.skipped, alone.cache.length) == (len(prompt) - 4, 4 + 1)
    quant = make_drafter("quant:int4@start=4", target, "cpu", "float32") if packed_kernel() else None
    assert quant is None or not quant.shares_prompt_cache  # a cheap start is asked for: no shared prompt


@needs_kernel
def test_quant_self_draft_starts_from_the_target_prompt_cache(models):
    """A quantized self-draft copies the target's prompt keys and values instead of prefilling the
    prompt again (the second prefill made it lose on long prompts); output stays the target's."""
    target = models["target"]
    drafter = make_drafter("quant:int4", target, "cpu", "float32")
    prefills = []
    forward = drafter.model.forward
    drafter.model.forward = lambda tokens, *args, **kwargs: (prefills.append(tokens.shape[1]), forward(tokens, *args, **kwargs))[1]
    prompt = "hello hello the world " * 4
    generated = SpeculativeGenerator(target, drafter, k=3).generate(prompt, 12, chat=False).token_ids
    assert generated == plain_ids(target, prompt, 12)
    prompt_length = len(target.tokenizer.encode(prompt))
    assert prefills and max(prefills) <= 3 + 2 < prompt_length - 1  # draft steps only, never the prompt


@needs_kernel
def test_an_explicit_prompt_window_is_kept_by_a_quant_self_draft(models):
    """quant:FORMAT@context=N prefills its window rather than sharing the target's prompt cache."""
    target = models["target"]
    windowed = make_drafter("quant:int4@context=4", target, "cpu", "float32")
    assert not windowed.shares_prompt_cache and make_drafter("quant:int4", target, "cpu", "float32").shares_prompt_cache


@pytest.mark.parametrize("target_name", ["target", "gemma3"])
@pytest.mark.parametrize("kind", list(REGISTRY))
def test_every_registered_drafter_equals_plain_greedy(models, kind, target_name):
    """Enumerated from the registry: a new drafter with a test_spec is checked here without a test edit,
    on a Llama-family target and on a Gemma 3 one (sliding-window layers)."""
    entry = REGISTRY[kind]
    if entry.test_spec is None:
        pytest.skip(f"{kind} needs files a test makes in its own module (tests of {kind})")
    if kind == "quant" and packed_kernel() is None:
        pytest.skip("quantized self-drafts need the CPU kernel")
    target = models[target_name]
    spec = entry.test_spec.format(target=target.path)
    for k in (3, "auto"):
        for prompt in PROMPTS:
            drafter = make_drafter(spec, target, "cpu", "float32")
            result = SpeculativeGenerator(target, drafter, k).generate(prompt, 30, chat=False)
            assert result.token_ids == plain_ids(target, prompt, 30), f"{spec} K={k} prompt={prompt!r}"


def test_help_and_docs_name_every_registered_drafter():
    from pathlib import Path

    from specdec.cli import build_parser

    docs = (Path(__file__).resolve().parent.parent / "docs" / "drafters.md").read_text()
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    help_text = "".join(generate.format_help().split())  # argparse wraps lines inside a spec
    for kind in REGISTRY.values():
        assert f"`{kind.name}" in docs, f"docs/drafters.md has no row for {kind.name}"
        assert "".join(kind.syntax.split()) in help_text, kind.syntax


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.9, "top_p": 0.95, "seed": 7}], ids=["greedy", "seeded"])
def test_a_mixture_of_experts_target_speculates_exactly_and_reports_its_experts(tmp_path, settings):
    """A Qwen3-MoE target (2 of 4 experts a token): speculative output equal to plain, greedy and seeded;
    a plain step runs exactly the picked experts a layer, a verification pass over more rows more of them."""
    target = load_model(str(save_tiny_model(tmp_path / "moe", "qwen3_moe", seed=12, mlp_only_layers=[])))
    prompt = "hello hello the world the world hello hello the world"
    plain = SpeculativeGenerator(target, None).generate(prompt, 40, chat=False, **settings)
    assert plain.stats.experts_per_pass == 2.0
    drafter = make_drafter("ngram", target, "cpu", "float32")
    speculative = SpeculativeGenerator(target, drafter, 4).generate(prompt, 40, chat=False, **settings)
    assert speculative.token_ids == plain.token_ids
    assert 2.0 < speculative.stats.experts_per_pass <= 4.0


def test_a_model_that_paid_on_earlier_answers_starts_once_the_wait_has_cost_its_start():
    """Ski rental: before `model_after_tokens`, a model starts once the tokens decoded without it have lost,
    at its predicted saving a token, more than its last start cost; a model not known to pay waits."""
    from specdec.core.speculation_length import SourceLengths

    def first_asked(model_accepts: int, start_seconds: float | None) -> int:
        lengths = SourceLengths(4)
        lookup = FixedLookup("lookup", [])
        drafter = CombinedDrafter([lookup, FixedSource("model", [1, 2])], model_after_tokens=16,
                                  start_seconds=[None, start_seconds])
        drafter.use_source_lengths(lengths)
        lengths.observe(0, 0, 0.0, 0.040)  # a plain step: 40 ms, 25 tokens/s
        for _ in range(8):  # earlier answers' rounds: two draft tokens of 5 ms, verified in 42 ms
            lengths.next_k_for((1, "draft"), min_k=1)
            lengths.observe(2, model_accepts, 0.010, 0.042, source=(1, "draft"))
        drafter.begin([50, 60], SamplingParams(), 64)
        for committed in range(20):
            if drafter.propose([50, 60, *range(committed)], 2, SamplingParams(), None).tokens:
                return committed
        return 20

    # all accepted: ~5 tokens in 62 ms at K = 4, so each token decoded plainly loses ~28 ms
    assert first_asked(2, start_seconds=0.05) == 2
    assert first_asked(2, start_seconds=0.2) == 8
    assert first_asked(2, start_seconds=None) == 16  # its start not measured yet
    assert first_asked(0, start_seconds=0.05) >= 16  # not known to pay: the whole wait (then the rates judge)
    drafter = CombinedDrafter([FixedLookup("lookup", []), FixedSource("model", [1])], start_seconds=[None, 0.1])
    assert drafter.fresh().start_seconds is drafter.start_seconds  # a served request's copy shares them


def test_a_models_acceptance_from_earlier_answers_weighs_at_most_a_few_rounds_in_a_new_one():
    """Answers change kind (questions, then translations): the model's fit carried into a new answer is held to
    MODEL_MEMORY_ROUNDS rounds of evidence, so a few rounds of the new answer outweigh many old ones, while the
    fit itself (and lookup's own) is kept."""
    from specdec.core.speculation_length import SourceLengths
    from specdec.drafters.combined import MODEL_MEMORY_ROUNDS

    lengths = SourceLengths(4)
    for _ in range(60):  # earlier answers: the model's two tokens always accepted, lookup's guesses never
        lengths.next_k_for((1, "draft"), min_k=1)
        lengths.observe(2, 2, 0.010, 0.042, source=(1, "draft"))
        lengths.next_k_for((0, "guess"))
        lengths.observe(2, 0, 0.0, 0.042, source=(0, "guess"))
    model, guess = lengths.lengths[(1, "draft")], lengths.lengths[(0, "guess")]
    guess_counts = guess.reached.copy()
    drafter = CombinedDrafter([FixedLookup("lookup", []), FixedSource("model", [1])])
    drafter.use_source_lengths(lengths)
    drafter.begin([50, 60], SamplingParams(), 256)
    assert model.reached[0] == pytest.approx(MODEL_MEMORY_ROUNDS) and model.alphas()[0] > 0.85
    assert (guess.reached == guess_counts).all()  # lookup asks nothing to start: its fit is left alone
    for _ in range(MODEL_MEMORY_ROUNDS):  # the new answer: every draft rejected
        model.observe(2, 0, 0.010, 0.042)
    assert model.alphas()[0] < 0.5


def test_a_model_starts_where_recent_answers_say_this_one_runs_long_enough_to_pay_its_start():
    """Where recent answers ran longer than this one, the tokens still to come are theirs on average: the model
    starts at once if they pay its start at its predicted saving, and never if they do not; where none ran
    longer, it is expected to run as long again (ski rental). Once started it is not stopped by this rule."""
    from specdec.core.speculation_length import SourceLengths
    from specdec.drafters.combined import RETRY_EVERY, AnswerLengths

    lengths = SourceLengths(4)
    lengths.observe(0, 0, 0.0, 0.040)  # a plain step: 40 ms, 25 tokens/s
    for _ in range(8):  # earlier answers' rounds, all accepted: each token decoded plainly loses ~28 ms
        lengths.next_k_for((1, "draft"), min_k=1)
        lengths.observe(2, 2, 0.010, 0.042, source=(1, "draft"))
        lengths.next_k_for((0, "guess"))  # lookup's guesses, all accepted, for nothing: faster than the model
        lengths.observe(2, 2, 0.0, 0.042, source=(0, "guess"))

    def asked(ran: list[int], start_seconds: float = 0.2, length: int = 40, guess: list[int] = []) -> list[int]:
        """After answers of `ran` tokens, the committed counts at which a `length`-token answer's model was
        asked (its start measured at `start_seconds`; lookup guessing `guess` each round)."""
        model = FixedSource("model", [1, 2])
        model.catch_up_seconds = start_seconds  # each of its starts measures this
        lookup = FixedLookup("lookup", guess)
        lookup.verbatim = False
        drafter = CombinedDrafter([lookup, model], model_after_tokens=16,
                                  start_seconds=[None, start_seconds], answers=AnswerLengths())
        drafter.use_source_lengths(lengths)
        for answer_length in [*ran, length]:  # the earlier answers, then this one
            drafter.begin([50, 60], SamplingParams(), 256)
            proposed = []
            for committed in range(answer_length):
                draft = drafter.propose([50, 60, *range(committed)], 2, SamplingParams(), None)
                if draft.tokens:
                    if drafter.proposer == 1:
                        proposed.append(committed)
                    drafter.on_verified([50, 60, *range(committed + 1)], draft, VerifyResult(len(draft), [], [0]))
        return proposed

    assert asked([])[0] == 8  # nothing to go by: ski rental (0.2 s against ~28 ms a token)
    assert asked([120, 120])[0] == 0  # long answers: ~120 tokens to come pay it at once
    # ... against a plain step; where lookup guesses faster, it waits, and is tried only as the rates retry it
    assert asked([120, 120], guess=[70, 50])[0] == 16 + RETRY_EVERY - 1
    # a dear start and no recent answers: ski rental alone (1 s against ~26 ms a token), never within 18 tokens
    assert asked([], start_seconds=1.0, length=18) == []
    assert asked([], start_seconds=1.0, length=60)[0] == 39
    assert asked([18, 18, 18], start_seconds=1.0, length=18) == []  # 18-token answers never pay 1 s
    assert asked([18, 18, 18], start_seconds=0.01)[0] == 0  # but pay a cheap start at once
    assert asked([18, 18], start_seconds=1.0, length=60)[0] == 39  # past every recent answer: ski rental again
    # 30-token answers pay 0.2 s from the start; at 23 tokens in, they would not any more, but it has started
    assert asked([30, 30]) == list(range(40))
    drafter = CombinedDrafter([FixedLookup("lookup", []), FixedSource("model", [1])])
    assert drafter.fresh().answers is drafter.answers  # a served request's copy learns from the ones before
