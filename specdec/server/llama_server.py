"""llama-server's own dialect: the bodies of `/completion`, `/tokenize`, `/detokenize` and `/apply-template`,
and the reply shapes (`content`, `stop`, `timings`) its clients read: llama.cpp's tools, editor plugins,
scripts written against llama-server. Fields it defines that we do not implement are ignored where their
meaning is a performance hint (`cache_prompt`: our prefix cache is always on) and refused otherwise by
their types.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specdec.core.rounds import GenerationResult
from specdec.core.sampling import SamplingParams
from specdec.server.protocol import MAX_STOP_CHARS, ChatMessage
from specdec.server.request_body import BadRequest
from specdec.server.replies import speculative_stats, timings


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

    def sampling(self) -> SamplingParams:
        return SamplingParams.of(self)

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


class LlamaReply:
    """llama-server's generation replies (`/completion`, `/infill`): `content`, `stop`, token counts,
    `timings`; streamed: `{"content", "stop": false}` events, then one with `"stop": true` and the summary."""

    media_type = "text/event-stream"

    def __init__(self, model: str):
        self.model = model

    def chunk(self, text: str) -> dict:
        return {"content": text, "stop": False}

    def last(self, result: GenerationResult) -> dict:
        return {"content": "", "stop": True, **self._summary(result)}

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        return {"content": result.text, "stop": True, "tokens_evaluated": prompt_tokens, **self._summary(result)}

    def _summary(self, result: GenerationResult) -> dict:
        return {"model": self.model, "tokens_predicted": len(result.token_ids),
                "stop_type": "limit" if result.finish_reason == "length" else "eos",
                "timings": timings(result), "specdec": speculative_stats(result)}
