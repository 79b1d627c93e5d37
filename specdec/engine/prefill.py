"""A prompt into the target's cache: every token but the last (the first round's input), in chunks a
scheduler can spread between other requests' rounds, a cached prefix copied instead of computed."""

from __future__ import annotations

from typing import Callable

import torch

from specdec.core.commit import StopCriteria
from specdec.core.sampling import check_seed
from specdec.errors import ContextLengthError
from specdec.models.base import positions_after


def criteria_within_context(prompt_ids: list[int], criteria: StopCriteria, max_context: int, seed: int | None
                            ) -> StopCriteria:
    """The stop criteria of a generation of this prompt, ending at the model's context limit (reported as
    "length"); ContextLengthError for a prompt that leaves no room, InvalidParameterError for a bad seed."""
    if not prompt_ids:
        raise ContextLengthError("the prompt is empty: at least one token is needed")
    check_seed(seed)
    if len(prompt_ids) >= max_context:
        raise ContextLengthError(f"prompt is {len(prompt_ids)} tokens; the model's context is {max_context} tokens")
    room = max_context - len(prompt_ids)
    if criteria.max_new_tokens > room:
        return StopCriteria(room, criteria.eos_token_ids, criteria.stop_strings)
    return criteria


class PromptPrefill:
    def __init__(self, target, cache, prompt_ids: list[int], hidden_layers: tuple[int, ...],
                 on_output: Callable[[object], None], prompt_cache=None):
        """on_output(out): each chunk's forward output (its hidden layers' states, when asked for);
        prompt_cache: a target cache whose first `length` slots hold prompt_ids[:length] (a cached prefix;
        at most the prompt's head), copied instead of computed at the prefill's start."""
        self.target, self.cache, self.hidden_layers, self.on_output = target, cache, hidden_layers, on_output
        self.head = prompt_ids[:-1]
        self.prompt_cache = prompt_cache
        self.reused_tokens = 0
        self.done = False

    @property
    def tokens_left(self) -> int:
        """Prompt tokens still to compute (a prefix cache's hit not yet counted)."""
        return 0 if self.done else len(self.head) - self.cache.length

    def use_prompt_cache(self, cache) -> None:
        """Before the prefill: copy the first `cache.length` slots of `cache` (keys and values of the prompt's
        first tokens, a prefix cache's hit) instead of computing them. None: compute them all."""
        if self.cache.length or self.done:
            raise RuntimeError("a prompt cache is taken before the prefill starts")
        self.prompt_cache = cache

    def step(self, max_tokens: int | None = None) -> int:
        """Prefill up to about max_tokens more prompt tokens (None: the rest); the tokens prefilled. Chunks end
        where the target's prefill can stop without changing its keys and values (`reusable_prefix`), so a
        chunked prompt decodes exactly as one prefilled at once; where the target has no such points (a GPU,
        a sliding window), the whole prompt goes at once."""
        start = self.cache.length
        if start == 0 and self.prompt_cache is not None:
            start = self._reuse_prompt_cache()
        stop = len(self.head)
        if max_tokens is not None and stop - start > max_tokens:
            step = max(1, max_tokens)
            point = self.target.reusable_prefix(start + step)
            while point <= start and start + step < stop:  # the next stopping point lies further on
                step *= 2
                point = self.target.reusable_prefix(start + step)
            stop = point if start < point < stop else stop
        if stop > start:
            tokens = torch.tensor([self.head[start:stop]], device=self.target.device)  # (1, n)
            out = self.target.forward(tokens, positions_after(start, stop - start, 1, tokens.device), self.cache,
                                      hidden_layers=self.hidden_layers, last_logits_only=True)
            self.on_output(out)
        self.done = stop == len(self.head)
        return stop - start

    def _reuse_prompt_cache(self) -> int:
        """Copy the given prompt cache's slots (keys and values of the head's first tokens) instead of
        computing them; the tokens reused. Feature drafters need the prompt's features, which a cache does
        not hold: they prefill it all."""
        given, self.prompt_cache = self.prompt_cache, None
        length = min(given.length, len(self.head))
        if self.hidden_layers or length == 0 or not self.cache.can_copy_from(given):
            return 0
        if length < len(self.head) and self.target.reusable_prefix(length) != length:
            return 0  # the rest of the prompt, computed after it, would not be what one prefill computes
        self.cache.copy_prefix_from(given, length)
        self.reused_tokens = length
        return length
