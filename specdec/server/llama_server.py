"""llama-server's own dialect: the bodies of `/completion`, `/tokenize`, `/detokenize` and `/apply-template`,
and the reply shapes (`content`, `stop`, `timings`, `completion_probabilities`) its clients read: llama.cpp's
tools, editor plugins, scripts written against llama-server. `grammar` and `json_schema` constrain the output
exactly (as chat's response_format), `n_probs` returns each token's top alternatives; fields it defines that
we do not implement are ignored where their meaning is a performance hint (`cache_prompt`: our prefix cache is
always on) and refused otherwise by their types.
"""

from __future__ import annotations

from typing import Callable

from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from specdec.api.request import MAX_TOP_LOGPROBS, GenerationRequest
from specdec.api.structured import GrammarSpec
from specdec.core.rounds import GenerationResult, StreamChunk, TokenLogprob
from specdec.core.sampling import SamplingParams
from specdec.errors import InvalidParameterError
from specdec.server.protocol import MAX_STOP_CHARS, ChatMessage, Tool, error_body
from specdec.server.request_body import BadRequest
from specdec.server.replies import KEEP_ALIVE, finite, speculative_stats, sse, timings


class LlamaSampling(BaseModel):
    """The sampling fields every llama-server generation body shares (its defaults: greedy here, as the
    editor plugins send it; llama-server's own default temperature is 0.8)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)
    n_predict: int = Field(default=-1, ge=-1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_k: int = Field(default=0, ge=0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, alias="repeat_penalty")  # llama-server's name
    repeat_last_n: int = Field(default=64, ge=-1)  # the penalty's window, llama-server's default
    seed: int | None = Field(default=None, ge=-1)
    stop: list[str] = Field(default_factory=list, max_length=4)
    stream: bool = False
    grammar: str | None = None  # a GBNF grammar the output must match
    json_schema: dict | None = None  # or a JSON schema
    n_probs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)  # each token's top alternatives, with their logprobs

    def sampling(self) -> SamplingParams:
        return SamplingParams.of(self)

    def output_grammar(self) -> GrammarSpec | None:
        """What the output must match: json_schema or grammar (one), compiled now (BadRequest naming it)."""
        if self.json_schema is not None and self.grammar:
            raise BadRequest("give json_schema or grammar, not both", "grammar")
        name = "json_schema" if self.json_schema is not None else "grammar"
        try:
            if self.json_schema is not None:
                return GrammarSpec("json_schema", self.json_schema)
            return GrammarSpec("gbnf", self.grammar) if self.grammar else None
        except InvalidParameterError as error:
            raise BadRequest(f"{name}: {error}", name) from None

    def generation_request(self, prompt: str | list[int], limit: int) -> GenerationRequest:
        """The request this body means for a prompt, generating at most `limit` tokens."""
        return GenerationRequest(prompt, limit, self.sampling(), self.checked_stop(), self.given_seed, chat=False,
                                 grammar=self.output_grammar(), logprobs=self.n_probs or None)

    def checked_stop(self) -> tuple[str, ...]:
        if any(not s or len(s) > MAX_STOP_CHARS for s in self.stop):
            raise BadRequest(f"stop strings must be 1 to {MAX_STOP_CHARS} characters", "stop")
        return tuple(self.stop)

    @property
    def given_seed(self) -> int | None:
        return None if self.seed in (None, -1) else self.seed


class CompletionBody(LlamaSampling):
    """`POST /completion`: a raw prompt (text, or token ids), continued."""

    prompt: str | list[int]
    model: str | None = None  # which served model (llama-server's router mode); None: the default
    cache_prompt: bool = True  # a hint: the prefix cache is always on

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt):
        if not prompt:
            raise ValueError("must not be empty")
        return prompt


class TokenizeBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    tokens: list[int]


class ApplyTemplateBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None  # listed by the template as a chat request's would be


class LlamaReply:
    """llama-server's generation replies (`/completion`, `/infill`): `content`, `stop`, token counts,
    `timings`; streamed: `{"content", "stop": false}` events, then one with `"stop": true` and the summary."""

    media_type = "text/event-stream"

    def __init__(self, model: str, token_text: Callable[[int], str] | None = None):
        self.model, self.token_text = model, token_text  # token_text: a token's spelling, for n_probs

    def chunk(self, text: str, logprobs: list[TokenLogprob] | None = None) -> dict:
        return {"content": text, "stop": False} | self._probabilities(logprobs)

    def last(self, result: GenerationResult) -> dict:
        return {"content": "", "stop": True, **self._summary(result)}

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        return {"content": result.text, "stop": True, "tokens_evaluated": prompt_tokens, **self._summary(result),
                **self._probabilities(result.logprobs)}

    # -- the stream: `data: {"content", "stop": false}` per round, a last one with stop true (jobs.stream_events)
    def stream_start(self, prompt_tokens: int) -> list[str]:
        return []

    def keep_alive(self) -> list[str]:
        return [KEEP_ALIVE]

    def stream_text(self, index: int, chunk: StreamChunk) -> list[str]:
        return [sse(self.chunk(chunk.text, chunk.logprobs))] if chunk.text or chunk.logprobs else []

    def stream_done(self, index: int, result: GenerationResult) -> list[str]:
        return [sse(self.last(result))]

    def stream_failed(self, message: str, kind: str) -> list[str]:
        return [sse(error_body(message, kind))]

    def stream_end(self, results: list[GenerationResult | None], prompt_tokens: int) -> list[str]:
        return []

    def nothing(self, prompt_tokens: int) -> dict:
        """n_predict 0: llama-server reads the prompt and generates nothing."""
        return {"content": "", "stop": True, "model": self.model, "tokens_evaluated": prompt_tokens,
                "tokens_predicted": 0, "stop_type": "limit"}

    def _probabilities(self, logprobs: list[TokenLogprob] | None) -> dict:
        """llama-server's `completion_probabilities`: each token with its logprob and its top alternatives."""
        if not logprobs:
            return {}
        return {"completion_probabilities": [{**self._token(entry.token, entry.logprob), "top_logprobs": [
            self._token(token, value) for token, value in entry.top]} for entry in logprobs]}

    def _token(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return {"id": token, "token": text, "bytes": list(text.encode("utf-8")), "logprob": finite(logprob)}

    def _summary(self, result: GenerationResult) -> dict:
        return {"model": self.model, "tokens_predicted": len(result.token_ids),
                "stop_type": "limit" if result.finish_reason == "length" else "eos",
                "timings": timings(result), "specdec": speculative_stats(result)}


def llama_limit(state, body: LlamaSampling) -> int:
    """n_predict as llama-server reads it, cut to the cap as llama-server cuts it to its own -n; -1 (or 0,
    answered without generating): the server's default. `state`: the served model's ServerState."""
    return min(body.n_predict, state.max_tokens_cap) if body.n_predict > 0 else state.default_max_tokens


def llama_nothing(reply: LlamaReply, prompt_tokens: int, stream: bool) -> Response:
    """The answer to n_predict 0, whole or as a stream of its one last event."""
    body = reply.nothing(prompt_tokens)
    if not stream:
        return JSONResponse(body)
    return StreamingResponse(iter([sse(body)]), media_type=reply.media_type)
