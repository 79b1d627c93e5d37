"""Logits -> probabilities under the user's sampling settings, and sampling.

The same `processed_probs` is applied to target and draft logits, so the
acceptance rule compares the distributions the user actually asked for
(temperature, top-k, top-p, min-p and repetition penalty all change them).
Order, as in transformers: repetition penalty, temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.core.rounds import TokenLogprob
from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    # how many of the latest context tokens the penalty looks back over: -1 all of them, 0 none (the penalty
    # is off), N the last N (llama.cpp's and Ollama's repeat_last_n, whose default window is 64)
    repeat_last_n: int = -1

    def __post_init__(self):
        checks = [
            (math.isfinite(self.temperature) and self.temperature >= 0, "temperature must be a finite number >= 0"),
            (isinstance(self.top_k, int) and self.top_k >= 0, "top_k must be an integer >= 0"),
            (math.isfinite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (math.isfinite(self.min_p) and 0 <= self.min_p < 1, "min_p must be in [0, 1)"),
            (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (isinstance(self.repeat_last_n, int) and self.repeat_last_n >= -1,
             "repeat_last_n must be an integer >= -1 (-1: the whole context, 0: no penalty)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidParameterError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalizes(self) -> bool:
        """Whether the repetition penalty changes any logit (a penalty of 1, or a window of 0, does not)."""
        return self.repetition_penalty != 1.0 and self.repeat_last_n != 0

    @classmethod
    def of(cls, source) -> "SamplingParams":
        """The sampling a request or a command line sets: `source`'s attributes named as these fields (a
        parsed HTTP body, argparse's namespace), each front end's one way to build it; a knob added here is
        read wherever its front end declares a field of the same name."""
        return cls(**{field.name: getattr(source, field.name) for field in dataclasses.fields(cls)
                      if getattr(source, field.name, None) is not None})


SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes


def check_seed(seed: int | None) -> None:
    """A seed torch's generator can take (None: a random one), else InvalidParameterError."""
    if seed is not None and not (isinstance(seed, int) and SEED_RANGE[0] <= seed < SEED_RANGE[1]):
        raise InvalidParameterError(f"seed must be an integer in [-2^63, 2^64), not {seed!r}")


def repetition_penalized(
    logits: torch.Tensor,  # (T, V): one row per position of a drafted chain
    history: torch.Tensor,  # (N,) token ids already in the context
    chain: Sequence[int],  # tokens drafted before each position: row j also penalizes chain[:j]
    penalty: float,
    window: int = -1,  # row j looks back over the last `window` of history + chain[:j] (-1: all of it)
) -> torch.Tensor:
    """Seen tokens' logits moved away from zero by `penalty` (divided where positive, multiplied where
    negative). A masked logit (-inf: a token a grammar forbids) stays -inf whatever the penalty, and an extreme
    one cannot turn a logit into NaN (-inf x 0) or +inf (see finite_scaled)."""
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)  # (T, V)
    if window < 0:
        seen[:, history] = True
        for row in range(1, logits.shape[0]):
            seen[row:, chain[row - 1]] = True
    else:  # each row's own window: the tokens before it, the latest `window` of them
        before = [*history.tolist(), *chain]
        for row in range(logits.shape[0]):
            end = len(history) + row
            seen[row, before[max(0, end - window): end]] = True
    penalized = finite_scaled(torch.where(logits < 0, logits * penalty, logits / max(penalty, TINIEST)))
    return torch.where(seen & torch.isfinite(logits), penalized, logits)


TINIEST = float(torch.finfo(torch.float32).smallest_normal)  # a divisor float32 does not round to zero
LARGEST = float(torch.finfo(torch.float32).max)


def finite_scaled(logits: torch.Tensor) -> torch.Tensor:
    """Logits after a scaling that may overflow: +inf (a large logit over a tiny temperature or penalty)
    becomes the largest float, so that the tied largest logits share the mass as the limit does, instead of
    softmax's NaN; -inf stays -inf (a masked token stays impossible); NaN, which no scaling of finite and
    -inf logits by a positive number makes, is left as it is."""
    return torch.nan_to_num(logits, nan=float("nan"), posinf=LARGEST, neginf=float("-inf"))


def processed_probs(
    logits: torch.Tensor,  # (T, V) float32
    params: SamplingParams,
    history: torch.Tensor | None = None,  # (N,) context ids, for the repetition penalty
    chain: Sequence[int] = (),
) -> torch.Tensor:
    """(T, V) probabilities after every setting; for greedy, one-hot at the argmax."""
    if params.penalizes and history is not None:
        logits = repetition_penalized(logits, history, chain, params.repetition_penalty, params.repeat_last_n)
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = finite_scaled(logits / max(params.temperature, TINIEST))
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # (T, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= 1 - params.top_p
        remove_sorted[..., -1] = False  # always keep the most likely token
        logits = logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))
    probs = logits.softmax(-1)
    if params.min_p > 0:
        threshold = params.min_p * probs.max(-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def token_logprobs(
    logits: torch.Tensor,  # (T, V): the rows that decided `tokens` (a grammar's mask already applied)
    tokens: Sequence[int],  # (T,) the tokens committed from them
    params: SamplingParams,
    history: Sequence[int],  # the context before tokens[0]
    top: int,
) -> list:
    """Each committed token's log-probability and the `top` likeliest tokens', under the distribution it was
    drawn from: the processed one (temperature, top-k/p, min-p, repetition penalty: what OpenAI reports
    with sampling), or for greedy decoding the model's own softmax (a one-hot law says nothing). Row by
    row, each with its own history, so the figures are those of plain decoding whatever the rounds."""
    out = []
    for row, token in enumerate(tokens):
        seen = torch.tensor([*history, *tokens[:row]], device=logits.device)
        if params.greedy:
            values = logits[row: row + 1].float().log_softmax(-1)[0]
            if params.penalizes:
                values = repetition_penalized(logits[row: row + 1].float(), seen, (), params.repetition_penalty,
                                              params.repeat_last_n)
                values = values.log_softmax(-1)[0]
        else:
            values = processed_probs(logits[row: row + 1].float(), params, seen)[0].log()
        best = torch.topk(values, top) if top else None
        out.append(TokenLogprob(int(token), float(values[token]),
                                [] if best is None else list(zip(best.indices.tolist(), best.values.tolist()))))
    return out


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(...,) the token each row of probs (..., V) puts at uniform u (...,) in [0, 1): the first index whose
    cumulative mass exceeds u * total, so a zero-probability token is never drawn (also where rounding
    carries u * total up to the total: the last token with mass is taken). The one sampling rule: plain
    sampling, the match rule and the rejection rule's residual draws all go through it."""
    cdf = probs.cumsum(-1)  # (..., V)
    scaled = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[..., -1:]  # (..., 1)
    index = torch.searchsorted(cdf, scaled, right=True).squeeze(-1)  # (...,)
    last_with_mass = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(-1)  # (...,)
    return torch.minimum(index, last_with_mass)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(...,) one token per row of probs (..., V) from a torch generator's uniforms (tests, tools).
    Faster than torch.multinomial for the few rows a round samples."""
    uniforms = torch.rand(probs.shape[:-1], generator=generator, device=probs.device)
    return inverse_cdf(probs, uniforms)


def tree_processed_probs(
    logits: torch.Tensor,  # (T+1, V): after the root, then after each tree node
    params: SamplingParams,
    history: torch.Tensor,  # (N,) committed context ids
    tree,  # specdec.core.tree.TokenTree
) -> torch.Tensor:
    """`processed_probs` for a token tree: row n + 1 also penalizes the tokens on node n's path."""
    if not params.penalizes:
        return processed_probs(logits, params)
    rows = [processed_probs(logits[:1], params, history)]
    for node in range(len(tree)):
        path = torch.tensor([tree.tokens[n] for n in tree.ancestors(node)], device=history.device)
        rows.append(processed_probs(logits[node + 1: node + 2], params, torch.cat([history, path])))
    return torch.cat(rows)
