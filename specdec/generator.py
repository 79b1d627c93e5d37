"""The Python API: load a target and a drafter, generate or stream text.

    from specdec import SpeculativeGenerator
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", k="auto")
    result = gen.generate("Write a haiku about caches.", max_new_tokens=64)
    print(result.text, result.stats.tau)
    for chunk in gen.stream([{"role": "user", "content": "Hi!"}]):
        print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import sys
from typing import Iterator, Sequence

from specdec.commit import StopCriteria
from specdec.drafters import Drafter, make_drafter
from specdec.engine import SpeculativeEngine
from specdec.rounds import GenerationResult, StreamChunk
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.models.sources.loading import LoadedModel, gguf_source, load_model
from specdec.sampling import SamplingParams
from specdec.speculation_length import AdaptiveK, FixedK, SpeculationLength
from specdec.verify import check_acceptance
from specdec.models.sources import zoo
from specdec.models.sources.zoo import DEFAULT_MODEL

Prompt = str | Sequence[dict]  # plain text, or chat messages [{"role": ..., "content": ...}]

# The best drafter measured for each model in the weight format it runs in; others get n-gram drafting.
# float32 on the CPU kernel: its own quantized copy. The zoo's 1.5B is a GGUF file dequantized, so the file's
# own blocks (quant:gguf) draft for it: nearly every token accepted, more than a 4-bit re-quantization gets,
# at the same cost a step (~1.1 GB more memory, ~25 s to repack the blocks at the first use, then a cache).
# On its GGUF blocks the 1.5B is served best by its 0.5B sibling re-quantized to 4 bits (pulled on first
# use, as the target is: the default does the fastest exact thing without flags), with an LM head over the
# first 32768 ids only: Qwen's 151,936-row head holds over a quarter of the 0.5B's weights, and byte-pair ids
# come roughly in merge (frequency) order, so the rows cut rarely hold the target's next token. Its 4-bit
# groups are 128 inputs wide, not 32: a draft step is memory-bound, and a float16 scale per 32 codes is an
# eighth more bytes, for no acceptance lost. On smollm2 a self-draft only ties n-gram. The 1.5B in bf16 (its
# float32 weights rounded) is still drafted best by the blocks: they agree with it nearly as often.
DEFAULT_DRAFTERS: dict[tuple[str, str], str] = {
    ("qwen2.5-coder-1.5b-instruct", "float32"): "quant:gguf",
    ("qwen2.5-coder-1.5b-instruct", "bf16"): "quant:gguf",
    ("qwen2.5-coder-1.5b-instruct", "gguf"): "draft:qwen2.5-coder-0.5b-instruct@weights=int4:128,vocab=32768",
}
# The longest draft `--k auto` considers (`auto:N` sets another). AdaptiveK picks K <= this from measured
# costs. A self-draft accepted nearly every token on code gains from long drafts, and a verification of up
# to 16 rows streams the weights once on AVX-512 builds; elsewhere the measured costs keep K short.
MAX_AUTO_K = 16


def is_auto(k: int | str) -> bool:
    """Whether K is left to measurements: 'auto' or 'auto:N' (validated by speculation_length)."""
    return isinstance(k, str) and (k == "auto" or k.startswith("auto:"))


def speculation_length(k: int | str) -> SpeculationLength:
    if is_auto(k):
        most = k.partition(":")[2]
        if most and not (most.isdigit() and 1 <= int(most) <= 64):
            raise InvalidParameterError(f"k: 'auto:N' needs N between 1 and 64, not {most!r}")
        return AdaptiveK(max_k=int(most) if most else MAX_AUTO_K)
    try:
        value = int(k)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"k must be an integer >= 1, 'auto' or 'auto:N', not {k!r}") from None
    if not 1 <= value <= 64:
        raise InvalidParameterError(f"k must be between 1 and 64, not {value}")
    return FixedK(value)


def speculation_for(drafter: Drafter | None, k: int | str) -> SpeculationLength:
    """How many tokens `drafter` drafts a round for K = `k`: chain drafters follow `speculation_length`."""
    if drafter is None:
        return FixedK(0)
    # Tree drafters (EAGLE, Medusa) draft a node budget, which AdaptiveK's chain model does not describe.
    if is_auto(k) and drafter.tree_node_budget is not None:
        return FixedK(drafter.tree_node_budget)
    return speculation_length(k)


def default_drafter(target: LoadedModel) -> str:
    """The drafter spec `drafter="default"` means for this target as loaded (DEFAULT_DRAFTERS), else n-gram.
    A float32 self-draft needs the target's layers on the CPU kernel: in bfloat16 on a CPU, torch's int4
    self-draft won decode-only on code but lost to n-gram over seven tasks with prefill counted."""
    weights = getattr(target.model, "weight_format", None)
    spec = DEFAULT_DRAFTERS.get((target.name, weights))
    if spec is None or (weights == "float32" and not target.model.layers_are_packed()):
        return "ngram"
    if spec == "quant:gguf" and gguf_source(target.path) is None:
        return "quant:int4"  # its float32 weights did not come from a GGUF file at hand: a 4-bit copy
    draft = spec[len("draft:"):].partition("@")[0] if spec.startswith("draft:") else None
    if draft is not None and not zoo.is_pulled(draft):
        print(f"specdec: {target.name}'s default draft is {draft} ({zoo.REGISTRY[draft].size_bytes / 1e6:.0f} MB; "
              "--drafter ngram needs none)", file=sys.stderr)
        try:
            zoo.ensure_pulled(draft)
        except SpecdecError as error:  # offline, say: still exact, only slower
            print(f"specdec: could not pull {draft} ({error}); drafting with n-gram instead", file=sys.stderr)
            return "ngram"
    return spec


class SpeculativeGenerator:
    def __init__(self, target: LoadedModel, drafter: Drafter | None = None, k: int | str = 4,
                 acceptance: str = "match"):
        """acceptance: how sampled drafts are judged (specdec.verify): "match" (the default) returns, for a
        seed, exactly the text plain sampling returns; "rejection" accepts more of a sampling draft model's
        tokens and is exact in distribution, but its text depends on how tokens fall into rounds."""
        self.target = target
        self.drafter = drafter
        self.acceptance = acceptance
        self.engine = SpeculativeEngine(target.model, drafter, speculation_for(drafter, k), acceptance)

    @classmethod
    def from_pretrained(
        cls,
        target: str = DEFAULT_MODEL,
        drafter: str = "default",
        k: int | str = "auto",
        device: str = "cpu",
        dtype: str = "float32",
        backend: str = "auto",
        weights: str = "auto",
        cuda_graphs: bool = True,
        acceptance: str = "match",
    ) -> "SpeculativeGenerator":
        speculation_length(k)  # validate before loading anything
        check_acceptance(acceptance)
        loaded = load_model(target, device=device, dtype=dtype, backend=backend, weights=weights,
                            cuda_graphs=cuda_graphs)
        if drafter == "default":
            drafter = default_drafter(loaded)
        return cls(loaded, make_drafter(drafter, loaded, device, dtype), k, acceptance)

    def request_engine(self, speculative: bool = True, k: int | str | None = None) -> SpeculativeEngine:
        """An engine for one generation that runs interleaved with others (the server): its own drafter state
        (`Drafter.fresh()`) over the shared weights, and K as this generator's unless `k` is given, which is
        read as the constructor reads it (a tree drafter's node budget for 'auto')."""
        if not speculative or self.drafter is None:
            return SpeculativeEngine(self.target.model, None, FixedK(0), self.acceptance)
        speculation = self.engine.speculation if k is None else speculation_for(self.drafter, k)
        return SpeculativeEngine(self.target.model, self.drafter.fresh(), speculation, self.acceptance)

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids of a prompt; chat messages (or text, when chat is on) go through the chat template."""
        tokenizer = self.target.tokenizer
        _check_text(prompt)
        if chat is None:
            chat = not isinstance(prompt, str) or self.target.has_chat_template
        if chat:
            if not self.target.has_chat_template:
                raise InvalidParameterError(f"model {self.target.name!r} has no chat template; use a plain prompt")
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            _check_messages(messages)
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return list(ids)
        if not isinstance(prompt, str):
            raise InvalidParameterError("chat messages need chat mode")
        ids = tokenizer.encode(prompt, add_special_tokens=True)
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
        return ids

    def _prepare(self, prompt: Prompt, max_new_tokens: int, stop: Sequence[str] | str | None, chat: bool | None,
                 **sampling) -> tuple[list[int], SamplingParams, StopCriteria]:
        params = SamplingParams(**sampling)
        stop_strings = (stop,) if isinstance(stop, str) else tuple(stop or ())
        criteria = StopCriteria(max_new_tokens, frozenset(self.target.eos_token_ids), stop_strings)
        return self.encode(prompt, chat), params, criteria

    def generate(self, prompt: Prompt, max_new_tokens: int = 128, *, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 stop: Sequence[str] | str | None = None, seed: int | None = None, chat: bool | None = None,
                 on_chunk=None) -> GenerationResult:
        ids, params, criteria = self._prepare(prompt, max_new_tokens, stop, chat, temperature=temperature,
                                              top_k=top_k, top_p=top_p, min_p=min_p,
                                              repetition_penalty=repetition_penalty)
        return self.engine.generate(ids, params, criteria, self.target.tokenizer, seed, on_chunk)

    def generate_batch(self, prompts: Sequence[Prompt], max_new_tokens: int = 128, *, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                       stop: Sequence[str] | str | None = None, seed: int | None = None, chat: bool | None = None,
                       max_batch: int = 16, row_budget: int | None | str = "auto",
                       prefix_cache_bytes: int = 256 << 20, on_result=None) -> list[GenerationResult]:
        """Generations of many prompts, run together: every round, the verify forwards of up to `max_batch`
        running generations go through the target as one batched pass, and a finished generation's place
        goes to the next prompt (continuous batching). Each result is the one generate() returns for its
        prompt with the same arguments (greedy: token for token; with a seed: the seed's text), each
        generation with its own drafter state. row_budget: target rows a round may verify, all generations
        together ("auto": the device's default, None: no limit); within it, draft rows go to the generations
        whose drafts are accepted most, while they pay (batch_drafts.py). Prompts that share a prefix (a
        few-shot header) compute it once: up to prefix_cache_bytes of prompts' keys and values are kept
        (prefix_cache.py; 0: none). on_result(index, result) is called as each one finishes."""
        from specdec.batch_drafts import PassCost
        from specdec.prefix_cache import PrefixCache
        from specdec.engine import default_row_budget, run_round_together

        if row_budget == "auto":
            row_budget = default_row_budget(self.target.model.device)

        if max_batch < 1:
            raise InvalidParameterError("max_batch must be at least 1")
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        repetition_penalty=repetition_penalty)
        jobs = [self._prepare(prompt, max_new_tokens, stop, chat, **sampling) for prompt in prompts]  # checked first
        results: list[GenerationResult | None] = [None] * len(jobs)
        waiting = list(range(len(jobs)))[::-1]
        running: list[tuple[int, object]] = []
        pass_cost, prefixes = PassCost(), PrefixCache(self.target.model, prefix_cache_bytes)
        while waiting or running:
            while waiting and len(running) < max_batch:
                index = waiting.pop()
                generation = self.request_engine().start(*jobs[index], self.target.tokenizer, seed)
                head = jobs[index][0][:-1]
                generation.use_prompt_cache(prefixes.lookup(head))
                generation.begin()
                prefixes.store(head, generation.cache)
                running.append((index, generation))
            ready = [generation for _, generation in running if not generation.finished]
            if ready:
                run_round_together(ready, row_budget, pass_cost)
            for index, generation in [entry for entry in running if entry[1].finished]:
                results[index] = generation.result()
                if on_result is not None:
                    on_result(index, results[index])
            running = [entry for entry in running if not entry[1].finished]
        return results

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, *, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
               stop: Sequence[str] | str | None = None, seed: int | None = None,
               chat: bool | None = None) -> Iterator[StreamChunk]:
        ids, params, criteria = self._prepare(prompt, max_new_tokens, stop, chat, temperature=temperature,
                                              top_k=top_k, top_p=top_p, min_p=min_p,
                                              repetition_penalty=repetition_penalty)
        return self.engine.stream(ids, params, criteria, self.target.tokenizer, seed)


def _check_text(prompt: Prompt) -> None:
    """Text a tokenizer can take: UTF-8-encodable (a lone surrogate, e.g. from JSON's "\ud800" or from
    undecodable bytes on a command line, is not)."""
    texts = [prompt] if isinstance(prompt, str) else [m.get("content") for m in prompt if isinstance(m, dict)]
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidParameterError("the prompt is not valid Unicode text (it holds a lone surrogate "
                                            "or bytes that are not UTF-8)") from None


def _check_messages(messages: list) -> None:
    if not messages:
        raise InvalidParameterError("messages must not be empty")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
            message.get("content"), str
        ):
            raise InvalidParameterError('each message needs a string "role" and a string "content"')
