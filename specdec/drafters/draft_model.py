"""A smaller model of the target's family drafts K tokens autoregressively.

The draft model keeps its own KV cache. It lags the committed context by at
least one token: `propose` first feeds the committed tokens it has not seen
(usually the last accepted token and the recovered/bonus one; at the first
proposal, the prompt) together with the first draft step, then one token per step. The last draft token is never fed;
`on_verified` truncates the cache to the committed tokens it saw.

Prompt window (`context=N`): the draft prefills only the prompt's last N tokens (at their true
positions) and sees everything generated after them. A long prompt then costs the draft N tokens of
prefill instead of all of them. A draft with more than N committed tokens to catch up on (first asked
late in an answer, or back after a combined drafter's lookup drafted a long run) restarts from the
context's last N instead. Output stays exact (only the draft's proposals change); acceptance drops
where the answer needs the prompt's beginning (a summary: halved, benchmarks 13).

Start window (`start=N`): the first proposal prefills only the last N committed tokens, and the draft
keeps every token it sees after that. Behind lookup (a combined drafter) a draft is first asked some way
into the answer, and its first prefill is what an answer that turns out short never earns back; a few
tokens of context are enough for its first guesses, and the context grows as the answer does.

Shared prompt cache (self-drafts): a quantized copy of the target has the target's layout, so instead of
prefilling the prompt a second time it starts from a copy of the target's prompt keys and values
(`take_prompt_cache`, called by the engine after the target's prefill): no draft prefill at all, and
the draft attends to the target's own view of the prompt.

Vocabularies: the draft must use the target's tokenizer. Checkpoints often pad
the embedding matrix to different sizes (Qwen2.5: 151936 vs 152064); the draft
distribution is computed over the target's vocabulary size, with ids the draft
model does not have at probability zero and ids the target does not have masked
out, so the acceptance rule stays exact.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import nn

from specdec.core.randomness import NoiseStream, unseeded_stream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams, inverse_cdf, processed_probs
from specdec.drafters.base import Drafter, module_bytes
from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdec.drafters.draft_options import with_head_vocab
from specdec.errors import InvalidParameterError
from specdec.models.base import positions_after
from specdec.models.kv_cache import KVCache
from specdec.models.sources.loading import LoadedModel, load_model

# More unseen tokens than the draft's own rounds leave behind (one or two): the first forward of this
# proposal is a prefill (the prompt, or what other sources drafted since).
CATCH_UP = 8


def same_tokenizer(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether the draft's token ids mean what the target's do (else it drafts through text)."""
    return target.tokenizer is draft.tokenizer or target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()


class DraftModelDrafter(Drafter):
    def __init__(self, draft: LoadedModel, target_vocab_size: int, min_confidence: float = 0.0,
                 name: str | None = None, shares_with: nn.Module | None = None, prompt_window: int | None = None,
                 shares_prompt_cache: bool = False, start_window: int | None = None):
        """min_confidence: stop drafting early when the draft's top probability falls below it
        (after at least one token): unlikely tokens cost a draft step and are rarely accepted.
        shares_with: the target's model when the draft reuses some of its tensors (self-drafts), so
        that memory_bytes counts only what the draft adds.
        prompt_window: prefill only the prompt's last prompt_window tokens (None: all of it).
        start_window: the first proposal prefills at most the last start_window committed tokens (None: as
        prompt_window says); the cache keeps every token fed after that.
        shares_prompt_cache: start from the target's prompt cache when the engine offers one (self-drafts of
        the target's layout; quant: drafts share unless a prompt window was asked for)."""
        self.name = name or f"draft:{draft.name}"
        self.shares_with = shares_with
        self.draft = draft
        self.model = draft.model
        self.vocab_size = target_vocab_size
        self.min_confidence = min_confidence
        self.prompt_window = prompt_window
        self.start_window = start_window
        self.shares_prompt_cache = shares_prompt_cache
        self.target_cache = None  # the target's cache holding the prompt, when shared
        self.cache = None
        self.skipped = 0  # prompt tokens before the window: context position = skipped + cache slot

    def fresh(self) -> "DraftModelDrafter":
        return DraftModelDrafter(self.draft, self.vocab_size, self.min_confidence, self.name,  # shares the weights
                                 self.shares_with, self.prompt_window, self.shares_prompt_cache, self.start_window)

    def memory_bytes(self) -> int:
        weights = module_bytes(self.model.weights_module(), self.shares_with)
        return weights + (self.cache.nbytes if self.cache is not None else 0)

    def take_prompt_cache(self, target_cache: KVCache) -> None:
        """The target's cache holding prompt[:-1], offered before `begin`; kept only by a sharing self-draft."""
        self.target_cache = target_cache if self.shares_prompt_cache else None

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        target_cache, self.target_cache = self.target_cache, None  # offered for this generation only
        window = len(prompt_ids) if self.prompt_window is None else self.prompt_window
        self.skipped = max(0, len(prompt_ids) - window)
        self.cache = self.model.new_cache(1, min(max_length - self.skipped, self.model.max_context))
        if (target_cache is not None and self.skipped == 0 and self.cache.can_copy_from(target_cache)
                and target_cache.length == len(prompt_ids) - 1):
            self.cache.copy_prefix_from(target_cache, target_cache.length)
        # Otherwise the prompt is prefilled by the first `propose`, with whatever was committed since: a
        # drafter combined with lookup may never be asked, and then never pays for the prompt.

    def _vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(V_draft,) -> (V_target,): pad missing ids with -inf, drop ids the target lacks."""
        if logits.shape[-1] >= self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = torch.full((*logits.shape[:-1], self.vocab_size - logits.shape[-1]), float("-inf"), device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        device = self.model.device
        pending = self._unseen(context)  # committed tokens the draft has not seen (>= 1)
        self.base_length = self.cache.length + len(pending)  # cache slots once they are fed
        greedy = params.greedy and not params.penalizes
        noise = noise or unseeded_stream()
        history = torch.tensor(context, device=device) if not greedy else None
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        feed = pending
        self.catch_up_seconds = 0.0
        for _ in range(max_tokens):
            started = time.perf_counter()
            out = self.model.forward(
                torch.tensor([feed], device=device),
                positions_after(self.skipped + self.cache.length, len(feed), 1, device),
                self.cache,
                last_logits_only=True,
            )
            if len(feed) > CATCH_UP:  # a prefill of what was committed while others drafted, or of the prompt
                self.catch_up_seconds = time.perf_counter() - started
            logits = self._vocab_logits(out.logits[0, -1])  # (V,)
            if greedy:
                token = int(logits.argmax())
                confidence = float(1.0 / (logits - logits[token]).exp().sum()) if self.min_confidence else 1.0
            else:
                seen = torch.cat([history, torch.tensor(tokens, dtype=torch.int64, device=device)])
                probs = processed_probs(logits.unsqueeze(0), params, seen)  # (1, V)
                # the token at absolute position len(context) + len(tokens), drawn with that position's uniform
                uniform = torch.tensor([noise.uniform(len(context) + len(tokens))], device=device)
                token = int(inverse_cdf(probs, uniform)[0])
                confidence = float(probs.max()) if self.min_confidence else 1.0
            if tokens and confidence < self.min_confidence:
                break  # early exit: this token is unlikely to be accepted
            if not greedy:
                rows.append(probs[0])
            tokens.append(token)
            feed = [token]
        draft_probs = torch.stack(rows) if rows else None  # (K, V)
        return Draft.chain(tokens, draft_probs)

    def _unseen(self, context: Sequence[int]) -> list[int]:
        """The committed tokens to feed before drafting. With a window, never more than its N: a draft first
        asked late in a generation, or after sitting out many rounds while lookup drafted, restarts from the
        context's last N tokens (at their true positions) rather than catching up on everything since the
        prompt's window; the restart costs fewer rows, and the draft still sees its N nearest tokens."""
        pending = list(context[self.skipped + self.cache.length:])
        window = self.prompt_window
        if self.start_window is not None and self.cache.length == 0:  # the first proposal: a cheap start
            window = self.start_window if window is None else min(window, self.start_window)
        if window is not None and len(pending) > window:
            self.cache.truncate(0)
            self.skipped = len(context) - window
            pending = list(context[self.skipped:])
        return pending

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        if not draft.tokens:
            return  # nothing was fed this round
        # The cache holds the context up to base_length, then the draft tokens fed so far;
        # keep those that were accepted.
        self.cache.truncate(min(self.cache.length, self.base_length + result.num_accepted))


def build(spec, target: LoadedModel, device: str, dtype: str) -> DraftModelDrafter:
    """`draft:MODEL[@options]` (a spec.DrafterSpec; its options: a DraftModelOptions)."""
    model, draft_options = spec.argument, spec.options
    # a draft model runs in the target's weight format unless weights=FORMAT says otherwise: who quantized
    # the target for speed wants a draft that is as fast (an int4 target gets an int4 draft)
    weights = draft_options.weights or target.model.weight_format
    # and on a GPU it replays CUDA graphs when the target does
    graphs = target.model.graphs is not None
    draft = load_model(model, device=device, dtype=dtype, weights=weights, cuda_graphs=graphs,
                       ids_tokenizer=target.tokenizer, adapter=draft_options.adapter)
    if not same_tokenizer(target, draft):  # drafts as text, re-tokenized for the target
        if draft_options.vocab or draft_options.context or draft_options.start or draft_options.confidence:
            raise InvalidParameterError(f"draft:{model}: its tokenizer differs from the target's; only weights=FORMAT and adapter=DIR "
                                        "apply to such a draft")
        return CrossTokenizerDrafter(draft, target.tokenizer, target.model.vocab_size, name=spec.text)
    draft = with_head_vocab(draft, draft_options.vocab)
    return DraftModelDrafter(draft, target.model.vocab_size, draft_options.confidence, name=spec.text,
                             prompt_window=draft_options.context, start_window=draft_options.start)
