"""Drafting with a model whose tokenizer differs from the target's (universal assisted generation).

The draft model continues the committed text in its own tokens; its continuation becomes text, the text is
re-tokenized with the target's tokenizer, and those target tokens are the draft. The proposal is
deterministic (the draft model's greedy continuation), so verification treats it as one-hot drafts: exact
under greedy decoding and under either sampling rule, whatever the draft proposes.

Re-tokenizing only the new text would split tokens wrongly where the draft continues a word the committed
text left open, so the last few committed target tokens are re-tokenized together with the new text
(a look-behind window), and a proposal is made only where that window comes back as the same tokens.
The draft model's cache follows the committed text: each round its token ids are recomputed from the text,
and the cache is kept up to where they agree with what it holds.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Drafter, module_bytes
from specdec.models.base import positions_after
from specdec.models.sources.loading import LoadedModel
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams

LOOK_BEHIND = 8  # committed target tokens re-tokenized with the draft's text


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


class CrossTokenizerDrafter(Drafter):
    def __init__(self, draft: LoadedModel, target_tokenizer, target_vocab_size: int, name: str | None = None):
        self.name = name or f"draft:{draft.name}"
        self.draft = draft
        self.model = draft.model
        self.target_tokenizer = target_tokenizer
        self.vocab_size = target_vocab_size
        self.cache = None
        self.fed: list[int] = []  # draft token ids whose keys and values the cache holds, in order

    def fresh(self) -> "CrossTokenizerDrafter":
        return CrossTokenizerDrafter(self.draft, self.target_tokenizer, self.vocab_size, self.name)

    def memory_bytes(self) -> int:
        return module_bytes(self.model.weights_module()) + (self.cache.nbytes if self.cache is not None else 0)

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        # the draft's tokens for a text are not the target's: room for twice as many (a round that would not
        # fit drafts nothing)
        self.cache = self.model.new_cache(1, min(self.model.max_context, 2 * max_length + 64))
        self.fed = []

    def _text(self, ids: Sequence[int]) -> str:
        return self.target_tokenizer.decode(list(ids), skip_special_tokens=False)

    def _draft_ids(self, text: str) -> list[int]:
        return list(self.draft.tokenizer.encode(text, add_special_tokens=False))

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        ids = self._draft_ids(self._text(context))
        if not ids or len(ids) + max_tokens >= self.cache.max_length:
            return Draft.empty()
        continuation = self._continue(ids, max_tokens)
        # the draft's new text, as its tokenizer writes it after the committed text
        new_text = self.draft.tokenizer.decode(ids + continuation)[len(self.draft.tokenizer.decode(ids)):]
        if not new_text:
            return Draft.empty()
        window = list(context[-LOOK_BEHIND:])
        retokenized = self.target_tokenizer.encode(self._text(window) + new_text, add_special_tokens=False)
        if list(retokenized[: len(window)]) != window:  # the window's boundary moved: no safe proposal
            return Draft.empty()
        tokens: list[int] = []
        for token in retokenized[len(window):][:max_tokens]:
            if token >= self.vocab_size:  # an added token the target's head has no row for
                break
            tokens.append(token)
        return Draft.chain(tokens)

    def _continue(self, ids: list[int], count: int) -> list[int]:
        """The draft model's greedy continuation of `ids` (its own tokens), `count` tokens long."""
        device = self.model.device
        keep = min(common_prefix_length(self.fed, ids), len(ids) - 1)  # at least one token to feed
        self.cache.truncate(keep)
        self.fed = self.fed[:keep]
        feed = ids[keep:]
        out: list[int] = []
        for _ in range(count):
            logits = self.model.forward(torch.tensor([feed], device=device),
                                        positions_after(len(self.fed), len(feed), 1, device), self.cache,
                                        last_logits_only=True).logits[0, -1]
            self.fed += feed
            token = int(logits.argmax())
            out.append(token)
            feed = [token]
        return out

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        pass  # the next proposal re-syncs the cache with the committed text
