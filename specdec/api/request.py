"""One generation request: what every front end (CLI, server, batch files, certify) builds from its own
inputs and the generator runs. Validated here, once, when it is built; nothing downstream re-checks or
re-assembles its settings.

    request = GenerationRequest("Write a haiku.", max_new_tokens=64,
                                sampling=SamplingParams(temperature=0.7), seed=1)
    result = generator.run(request)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence, TypedDict, Unpack

from specdec.api.structured import GrammarSpec
from specdec.core.sampling import SamplingParams, check_seed
from specdec.core.speculation_length import KSetting
from specdec.errors import InvalidParameterError

Prompt = str | Sequence[dict]  # plain text, or chat messages [{"role": ..., "content": ...}]
MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


class RequestKeywords(TypedDict, total=False):
    """The keyword methods' settings (`generate`, `stream`, `generate_batch`), as `GenerationRequest.of` reads
    them: a knob added there is added here once, not to each method."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    repeat_last_n: int
    stop: Sequence[str] | str | None
    seed: int | None
    chat: bool | None
    grammar: GrammarSpec | None


@dataclass(frozen=True)
class GenerationRequest:
    """prompt: text, chat messages, or token ids (a list of ints, used as they are);
    chat: apply the chat template (None: for messages, and for text when the model has a template);
    k: draft tokens per round for this request (None: the generator's), as `--k` reads it;
    speculative: False decodes plainly (no drafter) with everything else the same;
    grammar: what the output must match (a JSON schema, a regex, ...: api/structured.py), or None;
    logprobs: record each token's log-probability and this many alternatives' (0-20; None: none);
    tools: function definitions (OpenAI's `tools`) the chat template lists for the model;
    continue_final: the last chat message (the assistant's, begun by the client: Anthropic's prefill) is
    continued rather than answered by a new turn."""

    prompt: str | Sequence[dict] | Sequence[int]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    chat: bool | None = None
    k: KSetting | None = None  # given as an integer, 'auto' or 'auto:N' too: parsed here
    speculative: bool = True
    grammar: GrammarSpec | None = None
    logprobs: int | None = None
    tools: tuple[dict, ...] | None = None
    continue_final: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):  # one stop string given bare
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        if not isinstance(self.prompt, (str, list, tuple)):
            raise InvalidParameterError("the prompt must be text, chat messages or token ids")
        check_text(self.prompt)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise InvalidParameterError(f"max_new_tokens must be an integer >= 1, not {self.max_new_tokens!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidParameterError("sampling must be a SamplingParams")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidParameterError("stop strings must be non-empty text")
        check_seed(self.seed)
        if self.k is not None:
            object.__setattr__(self, "k", KSetting.parse(self.k))
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidParameterError(f"logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, not {self.logprobs!r}")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise InvalidParameterError("grammar must be a GrammarSpec")
        if self.continue_final and self.token_ids is None and (
                isinstance(self.prompt, str) or not self.prompt or not isinstance(self.prompt[-1], dict)
                or self.prompt[-1].get("role") != "assistant"):  # (once encoded to ids, it has done its part)
            raise InvalidParameterError("continuing the final message needs chat messages ending with the assistant's")

    @property
    def token_ids(self) -> list[int] | None:
        """The prompt's token ids when it was given as ids, else None (text or messages)."""
        prompt = self.prompt
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                                for t in prompt):
            return list(prompt)
        return None

    def replace(self, **changes) -> "GenerationRequest":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, prompt, max_new_tokens: int = 128, **settings: Unpack[RequestKeywords]) -> "GenerationRequest":
        """The request the generator's keyword methods (generate, stream, generate_batch) describe: the
        sampling knobs (SamplingParams' fields) become its SamplingParams."""
        unknown = sorted(set(settings) - set(RequestKeywords.__annotations__))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (request settings: "
                            f"{', '.join(RequestKeywords.__annotations__)})")
        stop = settings.get("stop")
        return cls(prompt, max_new_tokens, SamplingParams.of(SimpleNamespace(**settings)), () if stop is None else stop,
                   settings.get("seed"), settings.get("chat"), grammar=settings.get("grammar"))


def check_text(prompt: Prompt) -> None:
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
