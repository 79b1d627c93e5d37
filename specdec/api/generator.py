"""The Python API: load a target and a drafter, generate or stream text.

    from specdec import SpeculativeGenerator
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", k="auto")
    result = gen.generate("Write a haiku about caches.", max_new_tokens=64)
    print(result.text, result.stats.tau)
    for chunk in gen.stream([{"role": "user", "content": "Hi!"}]):
        print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import logging
from typing import Iterator, Sequence, Unpack

from jinja2 import TemplateError

from specdec.api.batch import BatchRunner
from specdec.api.options import GeneratorOptions
from specdec.api.prefix_cache import PrefixCache
from specdec.api.request import GenerationRequest, Prompt, RequestKeywords, check_text
from specdec.api.structured import GrammarConstraint, first_line
from specdec.core.commit import StopCriteria
from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.core.speculation_length import FixedK, KSetting
from specdec.core.verify import Acceptance
from specdec.drafters import Drafter, make_drafter
from specdec.engine import Generation, SpeculativeEngine, run_alone, speculation_for
from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import LoadedModel, load_model
from specdec.models.sources.zoo import DEFAULT_MODEL
from specdec.pairing.decision import Pairing, decide, record_run

# Notices a library user may silence (logging's last resort prints them to stderr when nothing is configured).
logger = logging.getLogger("specdec")

# Prompt tokens per prefill step when the caller follows the prefill's progress (`run(on_prefill=)`).
PREFILL_CHUNK = 512


def auto_pairing(target: LoadedModel, device: str, dtype: str) -> Pairing:
    """What `drafter="auto"` means for this target on this machine: the candidates calibrated once
    (specdec.pairing) and the decision remembered; one line on the "specdec" logger says what and why."""
    pairing = decide(target, device, dtype)
    logger.warning(f"specdec: {pairing.line}")
    return pairing


def auto_drafter(target: LoadedModel, device: str, dtype: str) -> str:
    """The drafter spec `drafter="auto"` means (auto_pairing)."""
    return auto_pairing(target, device, dtype).chosen


class SpeculativeGenerator:
    """A target with its drafter. Keyword methods for scripts (`generate`, `stream`, `generate_batch`); the
    same as requests (`run`, `start`, `run_batch` with a `GenerationRequest`), which front ends build."""

    def __init__(self, target: LoadedModel, drafter: Drafter | None = None, k: int | str | KSetting = 4,
                 acceptance: Acceptance | str = Acceptance.MATCH):
        """acceptance: how sampled drafts are judged (specdec.core.verify): "match" (the default) returns, for
        a seed, exactly the text plain sampling returns; "rejection" accepts more of a sampling draft model's
        tokens and is exact in distribution, but its text depends on how tokens fall into rounds."""
        self.target = target
        self.drafter = drafter
        self.acceptance = Acceptance.parse(acceptance)
        self.engine = SpeculativeEngine(target.model, drafter, speculation_for(drafter, KSetting.parse(k)), acceptance)
        self.pairing: Pairing | None = None  # where `drafter` is `auto`'s choice: its runs revise the decision

    @classmethod
    def from_pretrained(
        cls,
        target: str = DEFAULT_MODEL,
        drafter: str = "auto",
        k: int | str = "auto",
        device: str = "cpu",
        dtype: str = "float32",
        backend: str = "auto",
        weights: str = "auto",
        cuda_graphs: bool = True,
        acceptance: str = "match",
        kv_dtype: str = "auto",
    ) -> "SpeculativeGenerator":
        return cls.from_options(GeneratorOptions(target, drafter, k, device, dtype, backend, weights, cuda_graphs,
                                                 acceptance, kv_dtype))

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> "SpeculativeGenerator":
        """Load what `options` (checked when they were built, before anything loads) name."""
        loaded = load_model(options.target, device=options.device, dtype=options.dtype, backend=options.backend,
                            weights=options.weights, cuda_graphs=options.cuda_graphs, kv_dtype=options.kv_dtype)
        pairing = auto_pairing(loaded, options.device, options.dtype) if options.drafter.default else None
        drafter = options.drafter if pairing is None else pairing.chosen
        generator = cls(loaded, make_drafter(drafter, loaded, options.device, options.dtype), options.k,
                        options.acceptance)
        generator.pairing = pairing
        return generator

    # -- requests ----------------------------------------------------------------------------
    def run(self, request: GenerationRequest, on_chunk=None, prompt_cache=None, on_prefill=None) -> GenerationResult:
        """The request's result. on_chunk(StreamChunk) sees the text as it is committed; prompt_cache: a
        target cache holding the prompt but its last token (`prompt_cache()`), copied instead of computed;
        on_prefill(done, total): the prompt is prefilled in chunks of PREFILL_CHUNK tokens and this is told
        after each (a progress bar for long prompts; the keys and values are those of one prefill)."""
        generation = self.start(request)
        if prompt_cache is not None:
            generation.prefill.use_prompt_cache(prompt_cache)
        if on_prefill is not None:
            total = len(generation.prompt_ids) - 1
            while not generation.prefilled:
                generation.prefill_step(PREFILL_CHUNK)
                on_prefill(generation.cache.length, total)
        for chunk in run_alone(generation):
            if on_chunk is not None:
                on_chunk(chunk)
        if self.pairing is not None and generation.engine is self.engine:  # auto's drafter, as it runs by default
            record_run(self.pairing, generation.rounds)
        return generation.result()

    def start(self, request: GenerationRequest, interleaved: bool = False) -> Generation:
        """The request's generation, to drive (`run_alone`, or `prefill_step` and rounds by a batch runner):
        its cache allocated, nothing computed. It runs on the generator's own engine (one generation at a
        time: its drafter state and K's measurements carry over between calls) unless the request sets K or
        turns speculation off, or it runs `interleaved` with others: then its drafter state is its own."""
        criteria = StopCriteria(request.max_new_tokens, frozenset(self.target.eos_token_ids), request.stop)
        engine = self.request_engine(request.speculative, request.k) if interleaved else self.engine_for(request)
        constraint = None
        if request.grammar is not None:
            constraint = GrammarConstraint(request.grammar, self.target.tokenizer, self.target.model.vocab_size)
        return engine.start(self.prompt_ids(request), request.sampling, criteria, self.target.tokenizer,
                            request.seed, constraint, request.logprobs)

    def run_batch(self, requests: Sequence[GenerationRequest], max_batch: int = 16,
                  row_budget: int | None | str = "auto", prefix_cache_bytes: int = 256 << 20,
                  on_result=None) -> list[GenerationResult]:
        """Many requests run together (api/batch.py): every round, the verify forwards of up to `max_batch`
        running generations go through the target as one batched pass, and a finished generation's place
        goes to the next request (continuous batching). Each result is the one `run` returns for its
        request (greedy: token for token; with a seed: the seed's text), each generation with its own
        drafter state. row_budget: target rows a round may verify, all generations together ("auto": the
        device's default, None: no limit); within it, draft rows go to the generations whose drafts are
        accepted most, while they pay (batch_drafts.py). Prompts that share a prefix (a few-shot header)
        compute it once: up to prefix_cache_bytes of prompts' keys and values are kept (prefix_cache.py;
        0: none). on_result(index, result) is called as each one finishes."""
        runner = BatchRunner(self, PrefixCache(self.target.model, prefix_cache_bytes), row_budget)
        return runner.run(list(requests), max_batch, on_result)

    def engine_for(self, request: GenerationRequest) -> SpeculativeEngine:
        """The engine a request run alone uses: this generator's, or one of its own for a request that sets
        K or turns speculation off."""
        if request.speculative and request.k is None:
            return self.engine
        return self.request_engine(request.speculative, request.k)

    def request_engine(self, speculative: bool = True, k: KSetting | None = None) -> SpeculativeEngine:
        """An engine for one generation that runs interleaved with others (batches, the server): its own
        drafter state (`Drafter.fresh()`) over the shared weights, and K as this generator's unless `k` is
        given, which is read as the constructor reads it (a tree drafter's node budget for 'auto')."""
        if not speculative or self.drafter is None:
            return SpeculativeEngine(self.target.model, None, FixedK(0), self.acceptance)
        speculation = self.engine.speculation if k is None else speculation_for(self.drafter, k)
        return SpeculativeEngine(self.target.model, self.drafter.fresh(), speculation, self.acceptance)

    def prompt_cache(self, prompt_ids: Sequence[int]):
        """The target's cache after a prefill of prompt_ids[:-1], for `run(..., prompt_cache=)`: many
        generations of one prompt (certify's draws) compute it once."""
        return self.engine.prompt_cache(prompt_ids)

    # -- prompts -----------------------------------------------------------------------------
    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as checked token ids (its own ids, or its text or messages encoded).
        Thread-safe: a server calls it off its worker thread."""
        ids = request.token_ids
        if ids is None:
            return self.encode(request.prompt, request.chat, request.tools, request.continue_final)
        vocab = self.target.model.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidParameterError(f"prompt token ids must be in [0, {vocab})")
        return ids

    def encode(self, prompt: Prompt, chat: bool | None = None, tools: Sequence[dict] | None = None,
               continue_final: bool = False) -> list[int]:
        """Token ids of a prompt; chat messages (or text, when chat is on) go through the chat template,
        which lists `tools` (function definitions) where given; `continue_final`: the last message (the
        assistant's, begun by the client) is left open to be continued, not followed by a new turn."""
        tokenizer = self.target.tokenizer
        check_text(prompt)
        if chat is None:
            chat = not isinstance(prompt, str) or self.target.has_chat_template
        if chat:
            if not self.target.has_chat_template:
                raise InvalidParameterError(f"model {self.target.name!r} has no chat template; use a plain prompt")
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            _check_messages(messages)
            extra = {"tools": list(tools)} if tools else {}
            turn = {"continue_final_message": True} if continue_final else {"add_generation_prompt": True}
            try:
                ids = tokenizer.apply_chat_template(messages, tokenize=True, **turn, **extra)
            except TemplateError as error:  # messages this template cannot render (or refuses with its own check)
                raise InvalidParameterError(f"model {self.target.name!r}: its chat template cannot render these "
                                            f"messages ({first_line(error)})") from None
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return list(ids)
        if not isinstance(prompt, str):
            raise InvalidParameterError("chat messages need chat mode")
        ids = tokenizer.encode(prompt, add_special_tokens=True)
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
        return ids

    # -- keyword methods ---------------------------------------------------------------------
    # Their settings (temperature, top_k, top_p, min_p, repetition_penalty, stop, seed, chat, grammar) are
    # GenerationRequest.of's keywords, declared once in RequestKeywords.
    def generate(self, prompt: Prompt, max_new_tokens: int = 128, *, on_chunk=None,
                 **settings: Unpack[RequestKeywords]) -> GenerationResult:
        """The prompt's generation (greedy unless a temperature is given); `grammar`: what it must match."""
        return self.run(GenerationRequest.of(prompt, max_new_tokens, **settings), on_chunk)

    def generate_batch(self, prompts: Sequence[Prompt], max_new_tokens: int = 128, *, max_batch: int = 16,
                       row_budget: int | None | str = "auto", prefix_cache_bytes: int = 256 << 20, on_result=None,
                       **settings: Unpack[RequestKeywords]) -> list[GenerationResult]:
        """`run_batch` of one request per prompt, all with these settings (see run_batch)."""
        requests = [GenerationRequest.of(prompt, max_new_tokens, **settings) for prompt in prompts]
        return self.run_batch(requests, max_batch, row_budget, prefix_cache_bytes, on_result)

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, **settings: Unpack[RequestKeywords]
               ) -> Iterator[StreamChunk]:
        return run_alone(self.start(GenerationRequest.of(prompt, max_new_tokens, **settings)))


def _check_messages(messages: list) -> None:
    if not messages:
        raise InvalidParameterError("messages must not be empty")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidParameterError('each message needs a string "role" and a string "content"')
        calls = message.get("tool_calls")
        if not isinstance(message.get("content"), str) and not (calls and message.get("content") is None):
            raise InvalidParameterError('each message needs a string "role" and a string "content" (or, from '
                                        'the assistant, "tool_calls")')
