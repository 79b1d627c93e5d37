"""`generate --compare`: the same request decoded again without a drafter, side by side."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specdec.api.request import GenerationRequest
from specdec.core.rounds import GenerationResult
from specdec.core.verify import Acceptance


@dataclass(frozen=True)
class PlainComparison:
    plain_tokens_per_second: float
    speculative_tokens_per_second: float
    speedup: float
    # greedy and the match rule reproduce plain decoding token for token (True/False); the rejection rule only
    # in distribution (None)
    identical: bool | None

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        verdict = ("output identical to plain decoding" if self.identical
                   else "OUTPUT DIFFERS from plain decoding" if self.identical is False
                   else "rejection rule: outputs agree in distribution, not token for token")
        return (f"[speculative {self.speculative_tokens_per_second:.1f} tok/s vs plain "
                f"{self.plain_tokens_per_second:.1f} tok/s: {self.speedup:.2f}x; {verdict}]")


def compare_with_plain(generator, request: GenerationRequest, speculative: GenerationResult) -> PlainComparison:
    """Decode the request again without a drafter, same settings: speeds, speedup and identity of the outputs."""
    plain = generator.run(request.replace(speculative=False))
    speed, plain_speed = speculative.stats.tokens_per_second, plain.stats.tokens_per_second
    token_for_token = request.sampling.greedy or generator.acceptance is Acceptance.MATCH
    return PlainComparison(plain_speed, speed, speed / max(plain_speed, 1e-9),
                           speculative.token_ids == plain.token_ids if token_for_token else None)
