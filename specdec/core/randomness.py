"""Random numbers keyed by position: a seed decides the text, however tokens are grouped into rounds.

A stream of random numbers consumed round by round makes the text depend on K, on adaptive K's timings and
on where each round was cut short: the same uniform ends up deciding a different token. Here the uniform
that decides the token at absolute position t (its index in prompt + generated tokens) is a pure function of
(seed, t, purpose), computed by a counter-based generator (numpy's Philox: the seed is its key, position
and purpose its counter), so it is the same at any K, with any drafter, on any machine and device.

Purposes keep the numbers that play different parts independent:
  TOKEN     decides the token at t by inverse CDF. Plain sampling uses it, the match rule commits exactly
            that token, and a sampling drafter under the match rule draws its own token at t with it
            (coupling draft and target, so the draft agrees with the target as often as their CDFs allow).
  DRAFT     a sampling drafter's own draw at t under the rejection rule (independent of the verifier's).
  ACCEPT    the rejection rule's accept/reject test at t (`index` = which sibling of a tree node).
  RESIDUAL  the rejection rule's draw from the residual (or the bonus distribution) at t.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

_KEY_MASK = 2**64 - 1


class Purpose(IntEnum):
    TOKEN = 0
    DRAFT = 1
    ACCEPT = 2
    RESIDUAL = 3


def random_seed() -> int:
    """A seed for a generation the caller did not seed, drawn from torch's global generator: after
    `torch.manual_seed(n)` unseeded generations repeat, as transformers' `set_seed` + `generate` do."""
    return int(torch.randint(0, 2**62, ()).item())


@dataclass(frozen=True)
class PositionalNoise:
    """Uniforms in [0, 1) keyed by (seed, position, purpose, index). Seeds span [-2^63, 2^64) (as
    `sampling.check_seed` allows); a negative seed and its 2^64 complement are different keys."""

    seed: int

    def uniform(self, position: int, purpose: Purpose, index: int = 0) -> float:
        key = np.array([self.seed & _KEY_MASK, 1 if self.seed < 0 else 0], dtype=np.uint64)
        counter = np.array([position, int(purpose), index, 0], dtype=np.uint64)
        return float(np.random.Generator(np.random.Philox(key=key, counter=counter)).random())

    def uniforms(self, first_position: int, count: int, purpose: Purpose, device) -> torch.Tensor:
        """(count,) float32 uniforms for positions first_position .. first_position + count - 1."""
        values = [self.uniform(first_position + i, purpose) for i in range(count)]
        return torch.tensor(values, dtype=torch.float32, device=device)

    def stream(self, purpose: Purpose) -> "NoiseStream":
        return NoiseStream(self, purpose)


@dataclass(frozen=True)
class NoiseStream:
    """The uniforms of one purpose, by position: what a sampling drafter draws its token at t with."""

    noise: PositionalNoise
    purpose: Purpose

    def uniform(self, position: int) -> float:
        return self.noise.uniform(position, self.purpose)


def unseeded_stream() -> NoiseStream:
    """A stream for a drafter called outside a generation (tests, tools): a fresh random seed."""
    return PositionalNoise(random_seed()).stream(Purpose.TOKEN)
