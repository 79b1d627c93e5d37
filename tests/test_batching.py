"""Batched rounds: several requests' verify forwards in one pass (forward_batch) compute, row for row, what
each request's own forward computes, so a generation's tokens do not depend on what runs beside it."""

import pytest
import torch

from head_fixtures import eagle_drafter
from specdec.api.generator import SpeculativeGenerator
from specdec.kernels import packed_kernel
from specdec.models.base import ForwardRequest, positions_after, tree_attention_mask
from specdec.models.sources.loading import load_model
from specdec.engine import run_alone
from tiny_models import save_tiny_model

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="batched passes run on the CPU kernels")

PROMPTS = ["hello hello the world", "x", "in the beginning was the word", "a b a b a b", "the cat sat", "zz"]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    llama = save_tiny_model(root / "llama", "llama", seed=41)
    qwen2 = save_tiny_model(root / "qwen2", "qwen2", seed=42)
    return {"llama": load_model(str(llama)), "llama-int4": load_model(str(llama), weights="int4"),
            "qwen2": load_model(str(qwen2))}


def prefilled(model, length: int, seed: int):
    cache = model.new_cache(1, 128)
    tokens = torch.randint(0, model.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    model.forward(tokens, positions_after(0, length, 1, "cpu"), cache)
    return cache


def requests_for(model, seed: int) -> list[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """(cached length, new tokens, tree mask or None) of requests of other lengths: chains and a tree."""
    gen = torch.Generator().manual_seed(seed)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    shapes = [(7, 1, None), (30, 5, None), (2, 3, None), (19, 4, tree), (44, 8, None)]
    return [(past, torch.randint(0, model.vocab_size, (1, rows), generator=gen), mask) for past, rows, mask in shapes]


def forward_request(model, past, tokens, mask, seed):
    cache = prefilled(model, past, seed)
    if mask is None:
        return ForwardRequest(tokens, positions_after(past, tokens.shape[1], 1, "cpu"), cache)
    depth = mask.sum(1) - 1
    return ForwardRequest(tokens, (past + depth).unsqueeze(0), cache, tree_attention_mask(past, mask))


@pytest.mark.parametrize("name", ["llama", "llama-int4", "qwen2"])
def test_a_batched_pass_is_bit_identical_to_each_requests_own_forward(targets, name):
    model = targets[name].model
    layers = (0, model.num_layers)
    shapes = requests_for(model, seed=1)
    alone = []
    for index, (past, tokens, mask) in enumerate(shapes):
        request = forward_request(model, past, tokens, mask, index)
        alone.append((model.forward(request.tokens, request.positions, request.cache, request.attn_mask,
                                    hidden_layers=layers), request.cache))
    batch = [forward_request(model, past, tokens, mask, index) for index, (past, tokens, mask) in enumerate(shapes)]
    assert model._batch_plan(batch) is not None  # the one-pass path, not the fallback
    together = model.forward_batch(batch, hidden_layers=layers)
    for (out, cache), got, request in zip(alone, together, batch):
        assert torch.equal(got.logits, out.logits)
        assert all(torch.equal(got.hidden_states[i], out.hidden_states[i]) for i in layers)
        assert request.cache.length == cache.length
        assert torch.equal(request.cache.keys[:, :, :, :cache.length], cache.keys[:, :, :, :cache.length])


def test_the_identity_check_catches_a_batch_that_mixes_up_requests(targets, monkeypatch):
    """Control: a batched pass that hands each request the cache of its neighbour fails the comparison."""
    from specdec.models.layer_plan import LayerPlan

    model = targets["llama"].model
    shapes = requests_for(model, seed=2)[:3]
    shapes = [(past, tokens[:, :1], None) for past, tokens, _ in shapes]  # one row each: caches swap cleanly
    alone = [model.forward(r.tokens, r.positions, r.cache).logits
             for r in (forward_request(model, *shape, i) for i, shape in enumerate(shapes))]
    real = LayerPlan.run_batch

    def mixed_up(self, x, cos, sin, parts, *args):
        caches = [part[0] for part in parts]
        return real(self, x, cos, sin, [(caches[i - 1], rows, n) for i, (_, rows, n) in enumerate(parts)], *args)

    monkeypatch.setattr(LayerPlan, "run_batch", mixed_up)
    batch = [forward_request(model, *shape, i) for i, shape in enumerate(shapes)]
    together = model.forward_batch(batch)
    assert not all(torch.equal(got.logits, out) for got, out in zip(together, alone))


def generators(target):
    return {"none": SpeculativeGenerator(target, None),
            "ngram": SpeculativeGenerator.from_pretrained(str(target.path), drafter="ngram", k=4),
            "eagle": SpeculativeGenerator(target, eagle_drafter(target.model), k=10)}


@pytest.mark.parametrize("drafter", ["none", "ngram", "eagle"])
def test_generate_batch_returns_each_prompts_own_generation(targets, drafter):
    target = targets["llama"]
    generator = generators(target)[drafter]
    finished = []
    together = generator.generate_batch(PROMPTS, 40, chat=False, max_batch=4,  # 6 prompts: some join later
                                        on_result=lambda index, result: finished.append(index))
    assert sorted(finished) == list(range(len(PROMPTS)))
    for prompt, result in zip(PROMPTS, together):
        alone = generator.generate(prompt, 40, chat=False)
        assert result.token_ids == alone.token_ids and result.text == alone.text
        assert result.finish_reason == alone.finish_reason


def test_generate_batch_computes_a_shared_header_once_and_changes_nothing(targets, monkeypatch):
    from specdec.api.prefix_cache import PrefixCache

    hits = []
    real = PrefixCache.lookup
    monkeypatch.setattr(PrefixCache, "lookup", lambda self, head: hits.append(real(self, head)) or hits[-1])
    generator = generators(targets["llama"])["ngram"]
    header = "Answer briefly and exactly, in the same words as the question. "
    prompts = [header + question for question in ("what is a cat", "where is the sea", "who sat", "why")]
    together = generator.generate_batch(prompts, 24, chat=False, max_batch=2)
    assert [r.token_ids for r in together] == [generator.generate(p, 24, chat=False).token_ids for p in prompts]
    assert sum(hit is not None for hit in hits) == 3 and all(hit.length >= 16 for hit in hits[1:])


def test_seeded_sampling_in_a_batch_is_the_seeds_text(targets):
    generator = generators(targets["llama"])["ngram"]
    options = dict(temperature=0.9, top_p=0.95, seed=11, chat=False)
    together = generator.generate_batch(PROMPTS[:4], 32, **options)
    assert [r.token_ids for r in together] == [generator.generate(p, 32, **options).token_ids for p in PROMPTS[:4]]


def test_cli_generates_a_prompt_file_in_batches_and_resumes(targets, tmp_path, capsys):
    import json

    from specdec.cli import main

    target = targets["llama"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "id": f"p{i}"}) + "\n" for i, p in enumerate(PROMPTS[:5])))
    out = tmp_path / "out.jsonl"
    command = ["generate", "--input", str(prompts), "--output", str(out), "--target", str(target.path), "--drafter",
               "ngram", "--no-chat", "--max-new-tokens", "24", "--batch", "2"]
    assert main(command) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    alone = SpeculativeGenerator(target, None)
    assert sorted(line["index"] for line in lines) == list(range(5))
    for line in lines:
        assert line["id"] == f"p{line['index']}"
        assert line["token_ids"] == alone.generate(PROMPTS[line["index"]], 24, chat=False).token_ids
    # an interrupted run: two lines written, a third cut short; the rerun writes the other three, once each
    kept = out.read_text().splitlines()[:2]
    out.write_text("\n".join(kept) + "\n" + '{"index": 4, "te')
    assert main(command) == 0
    indices = [json.loads(line)["index"] for line in out.read_text().splitlines()]
    assert sorted(indices) == list(range(5))
    assert "3 results" in capsys.readouterr().err


def test_cli_prompt_file_errors_are_one_line(tmp_path, capsys):
    from specdec.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\nnot json\n')
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--input", str(bad), "--output", str(out)]) == 2
    assert "bad.jsonl:2: not JSON" in capsys.readouterr().err and not out.exists()
    assert main(["generate", "--input", str(bad)]) == 2
    assert "--input and --output go together" in capsys.readouterr().err


def test_a_row_budget_shrinks_the_drafts_of_a_batch_not_its_outputs(targets, monkeypatch):
    from specdec.core.batch_drafts import PassCost

    # The budget alone, shared evenly: the split by measured pass times depends on the machine's load (a busy
    # CI machine made drafting look unprofitable and left `tight` without drafts); draft_caps' own test covers it.
    monkeypatch.setattr(PassCost, "fit", lambda self: None)
    generator = generators(targets["llama"])["ngram"]
    prompts = ["a b a b a b a b", "hello hello hello hello", "x y x y x y", "the the the the"]  # lookup hits
    free = generator.generate_batch(prompts, 32, chat=False, row_budget=None)
    tight = generator.generate_batch(prompts, 32, chat=False, row_budget=8)  # 4 requests: 1 draft token each
    plain = generator.generate_batch(prompts, 32, chat=False, row_budget=4)  # no room for drafts at all
    assert [r.token_ids for r in free] == [r.token_ids for r in tight] == [r.token_ids for r in plain]
    assert sum(r.stats.drafted for r in free) > sum(r.stats.drafted for r in tight) > 0
    assert sum(r.stats.drafted for r in plain) == 0


def test_pass_cost_fits_seconds_against_rows_once_the_passes_differ():
    from specdec.core.batch_drafts import PassCost

    cost = PassCost()
    for _ in range(6):
        cost.observe(8, 0.013)
    assert cost.fit() is None  # all passes alike: no slope to tell
    for rows in (4, 12, 20, 28, 16, 8, 24):
        cost.observe(rows, 0.005 + 0.001 * rows)
    t0, slope = cost.fit()
    assert slope == pytest.approx(0.001, rel=0.05) and t0 == pytest.approx(0.005, rel=0.1)


def test_draft_rows_go_where_drafts_are_accepted_and_only_while_they_pay():
    from specdec.core.batch_drafts import acceptance_rate, draft_caps, even_caps
    from specdec.core.stats import RoundStats

    rates, wanted = [0.9, 0.2, 0.6], [8, 8, 8]
    assert draft_caps(rates, wanted, 32, None) == even_caps(3, 32) == [9, 9, 9]  # cost unknown: an even share
    assert draft_caps(rates, wanted, None, None) == [None] * 3
    cheap = draft_caps(rates, wanted, 12, (0.010, 0.0001))  # rows nearly free: the budget's 9 spare rows fill up
    assert sum(cheap) == 9 and cheap[0] > cheap[2] > cheap[1]
    steep = draft_caps(rates, wanted, 32, (0.001, 0.01))  # a row costs ten times a pass without rows: none
    assert steep == [0, 0, 0]
    middling = draft_caps(rates, wanted, 64, (0.005, 0.0005))
    assert middling[0] >= 3 and middling[1] == 0 and sum(middling) < sum(wanted)  # a^k falls below the row cost
    assert draft_caps(rates, [2, 8, 0], 64, (0.010, 0.0)) == [2, 8, 0]  # never past a generation's own K
    assert draft_caps([0.9], [5], 32, (0.01, 0.001)) == [None]  # alone: its own K, as without batching
    rounds = [RoundStats(4, 4, 3, 4, 0, 0, 0), RoundStats(4, 0, 0, 1, 0, 0, 0), RoundStats(4, 4, 1, 2, 0, 0, 0)]
    assert acceptance_rate(rounds) == pytest.approx((4 + 1) / (8 + 2)) and acceptance_rate([]) == 0.5


def test_a_draft_models_own_forwards_are_priced_beside_its_rows():
    """Issue 88: a batch drafts one generation after another, so a draft model's token costs its forward
    besides its row; lookup's costs next to nothing. Equal acceptance, unequal price: the cheap drafts first,
    and a model's draft that costs more than the tokens it adds is not drafted at all."""
    from specdec.core.batch_drafts import draft_caps, draft_seconds_per_token
    from specdec.core.stats import RoundStats

    cost, rates, wanted = (0.030, 0.001), [0.6, 0.6], [6, 6]
    assert draft_caps(rates, wanted, 64, cost) == draft_caps(rates, wanted, 64, cost, [0.0, 0.0])
    lookup, model = draft_caps(rates, wanted, 64, cost, [0.0, 0.002])
    assert lookup > model >= 1  # a cheap model's first tokens still pay (0.6 of a token for 3 ms)
    dearer = [draft_caps(rates, wanted, 64, cost, [0.0, seconds])[1] for seconds in (0.002, 0.004, 0.008)]
    assert dearer == sorted(dearer, reverse=True) and dearer[-1] == 0  # 9 ms for 0.6 of a token: not worth it
    rounds = [RoundStats(4, 4, 3, 4, 0.008, 0, 0), RoundStats(4, 0, 0, 1, 0.0, 0, 0), RoundStats(2, 2, 1, 2, 0.002, 0, 0)]
    assert draft_seconds_per_token(rounds) == pytest.approx(0.010 / 6) and draft_seconds_per_token([]) == 0.0


def test_the_server_and_the_batch_runner_stream_what_each_request_streams_alone(targets):
    """One round loop: the server's scheduler drives the batch runner's step(); both give each request the
    tokens, text and logprobs (top 2) it streams alone, seeded sampling included, chunk by chunk."""
    from specdec.api.batch import BatchRunner
    from specdec.api.events import Chunk, Done
    from specdec.api.request import GenerationRequest
    from specdec.core.sampling import SamplingParams
    from specdec.server.scheduler import Job, Scheduler

    generator = generators(targets["llama"])["ngram"]
    requests = [GenerationRequest(prompt, 24, SamplingParams(temperature=0.8 * (i % 2)), seed=i, chat=False,
                                  logprobs=2) for i, prompt in enumerate(PROMPTS[:4])]
    requests = [r.replace(prompt=generator.prompt_ids(r), chat=False) for r in requests]

    def joined(chunks):  # a request's chunks, whichever rounds they fell into
        assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
        entries = [entry for c in chunks for entry in c.logprobs]
        return ("".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids],
                [(e.token, e.logprob, e.top) for e in entries])

    alone = [joined(list(run_alone(generator.start(request)))) for request in requests]

    runner, streamed, done = BatchRunner(generator), {i: [] for i in range(4)}, set()
    for index, request in enumerate(requests):
        runner.admit(index, request)
    while runner.running:
        for index, event in runner.step():
            streamed[index] += [event.chunk] if isinstance(event, Chunk) else []
            done |= {index} if isinstance(event, Done) else set()
    assert done == {0, 1, 2, 3} and [joined(streamed[i]) for i in range(4)] == alone

    scheduler, served = Scheduler(generator, max_active=4), {i: [] for i in range(4)}
    for index, request in enumerate(requests):
        job = Job(request)
        job.emit = lambda event, index=index: served[index].append(event)
        scheduler.waiting.append(job)
    while scheduler.waiting or scheduler.active:
        scheduler._admit_some()
        scheduler._step()
    assert all(isinstance(events[-1], Done) for events in served.values())
    assert [joined([e.chunk for e in served[i] if isinstance(e, Chunk)]) for i in range(4)] == alone
