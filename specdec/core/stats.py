"""Per-round and per-generation statistics, reported with every generation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence


@dataclass
class RoundStats:
    k: int  # speculation length asked of the drafter
    drafted: int  # tokens it proposed
    accepted: int  # draft tokens kept
    committed: int  # tokens that became output (after EOS / stop / length trimming)
    draft_seconds: float
    verify_seconds: float  # the target forward
    other_seconds: float  # acceptance, commit, drafter rollback
    experts_per_layer: float | None = None  # a mixture of experts: distinct experts the verify pass ran, a layer


@dataclass
class GenerationStats:
    drafter: str
    prompt_tokens: int
    new_tokens: int
    seconds: float  # wall time, prefill included
    prefill_seconds: float
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float  # accepted / drafted
    acceptance_per_position: list[float]  # P(draft token i accepted | tokens before it accepted)
    tau: float  # tokens the target produced per forward: 1 + mean accepted drafts per round
    draft_seconds: float
    verify_seconds: float
    other_seconds: float
    tokens_per_second: float  # new tokens / wall time, prefill included
    decode_tokens_per_second: float  # new tokens / time after prefill
    k_chosen: dict[int, int] = field(default_factory=dict)  # K -> rounds that used it
    draft_ms_per_round: float = 0.0  # cost per round: drafting ...
    verify_ms_per_round: float = 0.0  # ... and the target's verify forward
    drafter_memory_bytes: int = 0  # what the drafter holds beyond the target (weights, caches, indexes)
    # a mixture-of-experts target: the distinct experts a verification pass ran per mixture layer (mean over
    # rounds; a step runs experts_per_token of them, a pass over K + 1 rows more): what verifying costs there
    experts_per_pass: float | None = None
    # prompt tokens whose keys and values came from a prefix cache instead of being computed (llama-server's
    # cache_n, OpenAI's cached_tokens): a later turn of a conversation recomputes only what it added
    cached_prompt_tokens: int = 0

    @classmethod
    def from_rounds(
        cls, drafter: str, prompt_tokens: int, rounds: list[RoundStats], seconds: float, prefill_seconds: float,
        drafter_memory_bytes: int = 0, cached_prompt_tokens: int = 0,
    ) -> "GenerationStats":
        new_tokens = sum(r.committed for r in rounds)
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        per_position = acceptance_per_position(rounds)
        k_chosen: dict[int, int] = {}
        for r in rounds:
            k_chosen[r.k] = k_chosen.get(r.k, 0) + 1
        decode_seconds = max(seconds - prefill_seconds, 1e-9)
        return cls(
            drafter=drafter,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            seconds=seconds,
            prefill_seconds=prefill_seconds,
            rounds=len(rounds),
            drafted=drafted,
            accepted=accepted,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            acceptance_per_position=per_position,
            tau=(accepted + len(rounds)) / len(rounds) if rounds else 0.0,
            draft_seconds=sum(r.draft_seconds for r in rounds),
            verify_seconds=sum(r.verify_seconds for r in rounds),
            other_seconds=sum(r.other_seconds for r in rounds),
            tokens_per_second=new_tokens / max(seconds, 1e-9),
            decode_tokens_per_second=new_tokens / decode_seconds,
            k_chosen=dict(sorted(k_chosen.items())),
            draft_ms_per_round=1e3 * sum(r.draft_seconds for r in rounds) / max(len(rounds), 1),
            verify_ms_per_round=1e3 * sum(r.verify_seconds for r in rounds) / max(len(rounds), 1),
            drafter_memory_bytes=drafter_memory_bytes,
            cached_prompt_tokens=cached_prompt_tokens,
            experts_per_pass=mean_or_none([r.experts_per_layer for r in rounds if r.experts_per_layer is not None]),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def acceptance_per_position(rounds: Sequence[RoundStats]) -> list[float]:
    """P(draft token i accepted | the tokens before it accepted), from the rounds that drafted it."""
    longest = max((r.drafted for r in rounds), default=0)
    per_position = []
    for i in range(longest):
        reached = [r for r in rounds if r.drafted > i and r.accepted >= i]
        per_position.append(sum(r.accepted > i for r in reached) / len(reached) if reached else 0.0)
    return per_position


def mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
