"""Certify a speculative configuration of a local model: greedy equality and sampled distributions.

Greedy: the speculative output equals plain greedy decoding token for token on every prompt; a first
difference is classified by the target's own logits there (an exact tie, a near tie within a logit margin:
rounding between batch sizes can flip those, or a real mismatch, which fails).
Sampled, on the first few prompts, N draws with seeds base .. base + N - 1:
- the first new token (itself drafted and verified) against the target's exact processed distribution
  at the prompt (goodness of fit);
- the first few new tokens together: under the match rule each draw must equal plain sampling with the
  same seed, token for token (a far stronger check than any test of distributions); under the rejection
  rule, whose text depends on the rounds, against plain sampling on other seeds (homogeneity).
Every chi-square test is judged at alpha / (number of tests), so the whole run's false-alarm rate is at
most alpha.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.bench.tasks import BenchPrompt
from specdec.certify.statistics import MIN_EXPECTED, ChiSquareResult, goodness_of_fit, homogeneity
from specdec.core.sampling import SamplingParams, processed_probs
from specdec.core.verify import Acceptance
from specdec.models.base import positions_after

OTHER_SEEDS = 1 << 40  # plain draws for the homogeneity test use seeds base + OTHER_SEEDS + i
END = "<end>"  # the outcome "an end-of-sequence token" (generations do not return the EOS token itself)


@dataclass(frozen=True)
class CertifySettings:
    samples: int = 2000  # draws per sampled prompt
    alpha: float = 1e-4  # the whole run's false-alarm rate
    joint_tokens: int = 3  # new tokens whose joint distribution is tested
    greedy_tokens: int = 64  # new tokens compared under greedy decoding
    sampled_prompts: int = 2  # the first prompts get the sampled tests
    tie_margin: float = 1e-3  # a first difference whose top-two logits are this close is a near tie
    seed: int = 0


@dataclass
class GreedyCase:
    prompt_id: str
    new_tokens: int
    outcome: str  # "identical", "exact tie", "near tie" or "mismatch"
    first_difference: int | None = None  # index of the first differing new token
    margin: float | None = None  # the target's top-two logit gap there

    @property
    def passed(self) -> bool:
        return self.outcome != "mismatch"


@dataclass
class SampledCase:
    prompt_id: str
    first_token: ChiSquareResult | None = None  # against the target's exact distribution (local runs)
    joint: ChiSquareResult | None = None  # rejection rule, endpoints: against plain sampling on other seeds
    seeded_identical: int | None = None  # match rule: draws equal to plain sampling with their seed
    draws: int = 0

    @property
    def passed(self) -> bool:
        return ((self.first_token is None or self.first_token.passed) and (self.joint is None or self.joint.passed)
                and (self.seeded_identical is None or self.seeded_identical == self.draws))


@dataclass
class CertifyReport:
    configuration: dict
    settings: CertifySettings
    greedy: list[GreedyCase] = field(default_factory=list)
    sampled: list[SampledCase] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(case.passed for case in self.greedy) and all(case.passed for case in self.sampled)

    def to_json(self) -> dict:
        sampled = [{**asdict(case), "passed": case.passed} for case in self.sampled]
        return {"passed": self.passed, "configuration": self.configuration, "settings": asdict(self.settings),
                "greedy": [{**asdict(case), "passed": case.passed} for case in self.greedy], "sampled": sampled}


def chi_square_tests(settings: CertifySettings, prompts: int, acceptance: Acceptance) -> int:
    """How many chi-square tests a run makes (the Bonferroni divisor of alpha)."""
    return min(prompts, settings.sampled_prompts) * (2 if acceptance is Acceptance.REJECTION else 1)


def certify_local(generator: SpeculativeGenerator, prompts: Sequence[BenchPrompt], params: SamplingParams,
                  settings: CertifySettings, configuration: dict, progress: bool = True) -> CertifyReport:
    """Run every check for `generator` (its target, drafter, K and acceptance rule) on `prompts`."""
    if not prompts:
        raise ValueError("no prompts to certify on")
    report = CertifyReport(configuration, settings)
    plain = SpeculativeGenerator(generator.target, None)
    encoded = [(prompt, generator.encode(prompt.prompt, chat=prompt.chat)) for prompt in prompts]
    sampled = [] if params.greedy else most_telling(generator, encoded, params, settings)
    tests = max(1, chi_square_tests(settings, len(sampled), generator.acceptance))
    level = settings.alpha / tests
    total = len(encoded) + len(sampled) * settings.samples
    with tqdm(total=total, desc="certify", unit="run", disable=not progress) as bar:
        for prompt, ids in encoded:
            report.greedy.append(greedy_case(generator, plain, prompt.prompt_id, ids, settings))
            bar.update(1)
        for prompt, ids in sampled:
            report.sampled.append(sampled_case(generator, prompt.prompt_id, ids, params, settings, level,
                                               lambda: bar.update(1)))
    return report


def most_telling(generator: SpeculativeGenerator, encoded: list, params: SamplingParams,
                 settings: CertifySettings) -> list:
    """The prompts for the sampled tests: the first `sampled_prompts` whose first new token is uncertain
    enough to test (more than MIN_EXPECTED of the draws expected off the likeliest token), then others.
    A chat answer often opens with one near-certain token, which a goodness-of-fit test cannot probe."""
    def uncertain(ids: list[int]) -> bool:
        history = torch.tensor(ids, device=generator.target.model.device)
        logits = next_token_logits(generator, ids).unsqueeze(0).to(history.device)
        top = float(processed_probs(logits, params, history)[0].max())
        return (1.0 - top) * settings.samples > MIN_EXPECTED

    if settings.sampled_prompts == 0:
        return []
    chosen, rest = [], []
    for pair in encoded:
        if len(chosen) == settings.sampled_prompts:
            break
        (chosen if uncertain(pair[1]) else rest).append(pair)
    return (chosen + rest)[:settings.sampled_prompts]


def _generate(generator: SpeculativeGenerator, ids: list[int], params: SamplingParams, max_new: int,
              seed: int | None, prompt_cache=None) -> list[int]:
    request = GenerationRequest(ids, max_new, params, seed=seed)
    return generator.run(request, prompt_cache=prompt_cache).token_ids


def _outcome(generator: SpeculativeGenerator, ids: list[int], params: SamplingParams, max_new: int, seed: int,
             prompt_cache) -> tuple:
    """The first `max_new` new tokens of a draw, ending in END where an end-of-sequence token came first."""
    drawn = _generate(generator, ids, params, max_new, seed, prompt_cache)
    return tuple(drawn) if len(drawn) == max_new else (*drawn, END)


def greedy_case(generator: SpeculativeGenerator, plain: SpeculativeGenerator, prompt_id: str, ids: list[int],
                settings: CertifySettings) -> GreedyCase:
    greedy = SamplingParams()
    ours = _generate(generator, ids, greedy, settings.greedy_tokens, None)
    reference = _generate(plain, ids, greedy, settings.greedy_tokens, None)
    if ours == reference:
        return GreedyCase(prompt_id, len(ours), "identical")
    index = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference)))
    logits = next_token_logits(generator, ids + reference[:index])
    top = torch.topk(logits, 2).values
    margin = float(top[0] - top[1])
    outcome = "exact tie" if margin == 0 else ("near tie" if margin <= settings.tie_margin else "mismatch")
    return GreedyCase(prompt_id, len(ours), outcome, index, margin)


def next_token_logits(generator: SpeculativeGenerator, context: list[int]) -> torch.Tensor:
    """(V,) the target's logits for the token after `context`, from one fresh forward."""
    model = generator.target.model
    tokens = torch.tensor([context], device=model.device)
    out = model.forward(tokens, positions_after(0, len(context), 1, model.device),
                        model.new_cache(1, len(context)), last_logits_only=True)
    return out.logits[0, -1].float().cpu()


def sampled_case(generator: SpeculativeGenerator, prompt_id: str, ids: list[int], params: SamplingParams,
                 settings: CertifySettings, level: float, tick: Callable[[], None]) -> SampledCase:
    plain = SpeculativeGenerator(generator.target, None)
    history = torch.tensor(ids, device=generator.target.model.device)
    probs = processed_probs(next_token_logits(generator, ids).unsqueeze(0).to(history.device), params,
                            history)[0].cpu()  # (V,)
    eos = set(generator.target.eos_token_ids)
    exact: dict = {}
    for token in probs.nonzero().squeeze(1).tolist():
        key = END if token in eos else token
        exact[key] = exact.get(key, 0.0) + float(probs[token])
    prompt_cache = generator.prompt_cache(ids)  # one prefill for all draws (an exact copy each time)
    first: dict = {}  # first new token (or END) -> draws
    ours: dict[tuple, int] = {}
    theirs: dict[tuple, int] = {}
    identical = 0
    length = settings.joint_tokens
    for i in range(settings.samples):
        seed = settings.seed + i
        drawn = _outcome(generator, ids, params, length, seed, prompt_cache)
        first[drawn[0]] = first.get(drawn[0], 0) + 1
        if generator.acceptance is Acceptance.MATCH:
            identical += drawn == _outcome(plain, ids, params, length, seed, prompt_cache)
        else:
            ours[drawn] = ours.get(drawn, 0) + 1
            other = _outcome(plain, ids, params, length, seed + OTHER_SEEDS, prompt_cache)
            theirs[other] = theirs.get(other, 0) + 1
        tick()
    case = SampledCase(prompt_id, goodness_of_fit(first, exact, level), draws=settings.samples)
    if generator.acceptance is Acceptance.MATCH:
        case.seeded_identical = identical
    else:
        case.joint = homogeneity(ours, theirs, level)
    return case
