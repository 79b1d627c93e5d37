"""The round loop: draft -> verify -> accept -> commit.

Cache discipline (invariant 2): the target's cache holds every committed token
except the last one, which is the first input of the next round. A round feeds
[last committed token] + K draft tokens to the target in one forward, which
yields the target's distribution after each of them (K + 1 rows: K to judge the
drafts, one for the bonus token), then truncates the cache back to the
committed tokens. With no drafter (K = 0) the round is one plain decoding step,
so plain decoding and speculative decoding share this one loop.

    round.py        the Round value and the phases' pure parts (verify inputs, acceptance, cache kept)
    round_steps.py  what a request or drafter adds to every phase (grammar, logprobs, target features)
    prefill.py      the prompt into the target's cache, in chunks
    generation.py   one generation driven round by round
    batched.py      one round of one or several generations (their verify forwards one pass), and the
                    driver of a generation alone (run_alone)
    speculative_engine.py  a target and a drafter: generations started from it
"""

from specdec.engine.batched import BatchedRound, run_alone, run_round_together
from specdec.engine.generation import Generation
from specdec.engine.round import Round, with_side_inputs
from specdec.engine.round_steps import MAX_FORCED
from specdec.engine.speculative_engine import SpeculativeEngine, speculation_for

__all__ = ["BatchedRound", "Generation", "MAX_FORCED", "Round", "SpeculativeEngine", "run_alone", "run_round_together",
           "speculation_for", "with_side_inputs"]
