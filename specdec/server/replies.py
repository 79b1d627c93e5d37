"""OpenAI response bodies for one request: chat.completion / text_completion objects, their stream chunks,
`logprobs` in each API's shape, and tool calls read back from the text (server/tools.py)."""

from __future__ import annotations

import json
from typing import Callable, Sequence

from specdec.core.analysis import fit_generation
from specdec.core.rounds import GenerationResult, RoundProvenance, StreamChunk, TokenLogprob
from specdec.core.stats import RoundStats
from specdec.server.protocol import error_body, new_id, now, usage
from specdec.api.reasoning import Reasoning
from specdec.server.answer import AnswerPart, AnswerStream, whole_answer


KEEP_ALIVE = ": keep-alive\n\n"  # a server-sent events comment: every client skips it


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def named_sse(payload: dict) -> str:
    """A server-sent event named by its payload's type, as the Responses and Anthropic streams are."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def speculative_stats(result: GenerationResult) -> dict:
    """The extension field with this request's speculation figures."""
    s = result.stats
    return {"drafter": s.drafter, "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4), "tau": round(s.tau, 4),
            "tokens_per_second": round(s.decode_tokens_per_second, 2)}


def cached_tokens(results: list[GenerationResult]) -> int:
    """The prompt tokens a prefix cache held before this request: its choices share one prompt, and the
    later ones copy what the first computed, which was not held before."""
    return min(result.stats.cached_prompt_tokens for result in results)


def timings(result: GenerationResult) -> dict:
    """llama-server's `timings` object, from the generation's statistics; draft_n / draft_n_accepted are
    what llama.cpp reports for its speculative modes, so a tool that reads them sees the speculation."""
    s = result.stats
    decode_seconds = max(s.seconds - s.prefill_seconds, 1e-9)
    computed = s.prompt_tokens - s.cached_prompt_tokens  # llama-server's prompt_n: the prompt tokens computed
    return {"cache_n": s.cached_prompt_tokens, "prompt_n": computed, "prompt_ms": s.prefill_seconds * 1000,
            "prompt_per_second": computed / max(s.prefill_seconds, 1e-9),
            "predicted_n": s.new_tokens, "predicted_ms": decode_seconds * 1000,
            "predicted_per_token_ms": decode_seconds * 1000 / max(s.new_tokens, 1),
            "predicted_per_second": s.decode_tokens_per_second,
            "draft_n": s.drafted, "draft_n_accepted": s.accepted}


def speculation_fit(rounds: list[RoundProvenance]) -> dict | None:
    """The theory's reading of a streamed answer's rounds (core/analysis.fit_generation): acceptance per
    position (with how many rounds judged each: a position few reached shows the fit's prior more than a
    measurement), cost ratios, and the expected speedup at each K; None when nothing was drafted."""
    fit = fit_generation([RoundStats(r.k, r.drafted, r.accepted, len(r.origins), r.draft_ms / 1000,
                                     r.verify_ms / 1000, 0.0) for r in rounds])
    if fit is None:
        return None
    samples = [sum(r.drafted > j and r.accepted >= j for r in rounds) for j in range(len(fit.alphas))]
    return {"alphas": [round(a, 4) for a in fit.alphas], "samples": samples, "draft_cost": round(fit.draft_cost, 4),
            "verify_slope": round(fit.verify_slope, 4), "mean_k": round(fit.mean_k, 3),
            "speedup_by_k": [round(x, 4) for x in fit.speedup_by_k], "best_k": fit.best_k}


class Reply:
    """Builds the response objects of one request (chat.completion or text_completion), its `n` choices
    included. token_text(id) spells a token for `logprobs`; with `tools` a chat answer's tool calls are
    read back into `tool_calls` (finish_reason "tool_calls"); with `reasoning` a chat answer's <think> block
    goes to `reasoning_content` (api/reasoning.py); with `timings` llama-server's timings object goes beside
    `usage`, as llama-server writes it for clients that read its speculation figures."""

    media_type = "text/event-stream"

    def __init__(self, chat: bool, model: str, include_usage: bool, token_text: Callable[[int], str],
                 tools: Sequence[dict] = (), choices: int = 1, reasoning: Reasoning | None = None,
                 timings: bool = False, speculation: bool = False):
        self.chat, self.model, self.include_usage, self.tools = chat, model, include_usage, tools
        self.token_text = token_text
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.reasoning = reasoning if chat else None
        self.answers = [AnswerStream(tools, self.reasoning) for _ in range(choices)] if chat else []
        self.choices = choices
        self.speculation = speculation  # each stream chunk's tokens with their provenance (the extension)
        self.rounds: list[list[RoundProvenance]] = [[] for _ in range(choices)]  # what was streamed, per choice
        self.timings = timings  # llama-server's `timings` beside `usage` (timings_per_token), per choice
        self.text_offsets = [0] * choices  # completions' logprobs: where each token's text starts

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    @property
    def _object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    # -- whole replies ---------------------------------------------------------------------------
    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        choices = [self._choice(index, result) for index, result in enumerate(results)]
        body = self._envelope(self._object, choices)
        body["usage"] = usage(prompt_tokens, sum(len(result.token_ids) for result in results), cached_tokens(results))
        body["specdec"] = speculative_stats(results[0]) if len(results) == 1 else [
            speculative_stats(result) for result in results]
        if self.timings:
            body["timings"] = timings(results[0]) if len(results) == 1 else [timings(result) for result in results]
        return body

    def _choice(self, index: int, result: GenerationResult) -> dict:
        logprobs = None if result.logprobs is None else self.logprobs(result.logprobs, index)
        if not self.chat:
            return {"index": index, "text": result.text, "finish_reason": result.finish_reason, "logprobs": logprobs}
        thought, content, calls = whole_answer(result.text, self.tools, self.reasoning)
        message = {"role": "assistant", "content": content}
        if thought is not None:
            message["reasoning_content"] = thought
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": "tool_calls" if calls else result.finish_reason}

    # -- stream chunks ---------------------------------------------------------------------------
    def opening(self, index: int = 0) -> dict:
        """A choice's first chunk: the assistant role (chat), or an empty text."""
        if self.chat:
            return self._chunk(index, {"role": "assistant", "content": ""})
        return self._chunk(index, text="")

    def delta(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> list[dict]:
        """The chunks for new text of choice `index` (none where it is held: a tool call being written, a
        tag cut in two)."""
        entries = None if logprobs is None else self.logprobs(logprobs, index)
        if not self.chat:
            return [self._chunk(index, text=text, logprobs=entries)] if text or entries else []
        return self._chat_chunks(index, self.answers[index].feed(text), entries)

    def _chat_chunks(self, index: int, parts: list[AnswerPart], entries: dict | None) -> list[dict]:
        """Reasoning, then content, then the tool calls completed; the round's logprobs on the first chunk."""
        chunks: list[dict] = []
        calls_before = self.answers[index].call_count - sum(part.kind == "call" for part in parts)
        for part in parts:
            if part.kind == "call":
                chunks.append(self._chunk(index, {"tool_calls": [part.call.to_openai(calls_before)]}))
                calls_before += 1
            else:
                field = "reasoning_content" if part.kind == "reasoning" else "content"
                chunks.append(self._chunk(index, {field: part.text}, logprobs=entries))
                entries = None
        if entries:
            chunks.append(self._chunk(index, {"content": ""}, logprobs=entries))
        return chunks

    def closing(self, index: int, result: GenerationResult) -> list[dict]:
        """A choice's last chunks: held text, then its finish_reason (with the speculation figures)."""
        chunks = []
        if self.chat:
            chunks = self._chat_chunks(index, self.answers[index].finish(), None)
        reason = "tool_calls" if self.chat and self.answers[index].call_count else result.finish_reason
        last = self._chunk(index, {} if self.chat else None, text="" if not self.chat else None,
                           finish_reason=reason)
        last["specdec"] = speculative_stats(result)
        if self.timings:
            last["timings"] = timings(result)
        if self.speculation:
            last["speculation_fit"] = speculation_fit(self.rounds[index])
        return chunks + [last]

    def usage_chunk(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        body = self._envelope(self._object + ("" if not self.chat else ".chunk"), [])
        body["usage"] = usage(prompt_tokens, sum(len(result.token_ids) for result in results), cached_tokens(results))
        return body

    def _chunk(self, index: int, delta: dict | None = None, text: str | None = None, finish_reason: str | None = None,
               logprobs: dict | None = None) -> dict:
        if self.chat:
            choice = {"index": index, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": logprobs}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
        return self._envelope("text_completion", [choice])

    # -- the stream as server-sent events (jobs.stream_events drives every dialect's reply this way) ----
    def stream_start(self, prompt_tokens: int) -> list[str]:
        return [sse(self.opening(index)) for index in range(self.choices)]

    def keep_alive(self) -> list[str]:
        return [KEEP_ALIVE]

    def stream_text(self, index: int, chunk: StreamChunk) -> list[str]:
        chunks = self.delta(index, chunk.text, chunk.logprobs)
        if self.speculation and chunk.provenance is not None:
            if not chunks:  # the text is held (a tag, a stop string's start): the tokens still go out
                chunks = [self._chunk(index, {} if self.chat else None, text="" if not self.chat else None)]
            chunks[0]["speculation"] = self.provenance(chunk)
            self.rounds[index].append(chunk.provenance)
        return [sse(body) for body in chunks]

    def stream_done(self, index: int, result: GenerationResult) -> list[str]:
        return [sse(chunk) for chunk in self.closing(index, result)]

    def stream_failed(self, message: str, kind: str) -> list[str]:
        return [sse(error_body(message, kind))]

    def stream_end(self, results: list[GenerationResult | None], prompt_tokens: int) -> list[str]:
        """The usage chunk when asked for (all choices done), then [DONE]."""
        ended = all(result is not None for result in results)
        return ([sse(self.usage_chunk(results, prompt_tokens))] if self.include_usage and ended else []) + \
            ["data: [DONE]\n\n"]

    def provenance(self, chunk: StreamChunk) -> dict:
        """The `speculation` extension of one round's chunk: each committed token (id, its own spelling, how
        it was made) and the round's figures."""
        p = chunk.provenance
        return {"tokens": [{"id": token, "text": self.token_text(token), "origin": origin}
                           for token, origin in zip(chunk.token_ids, p.origins)],
                "source": p.source, "k": p.k, "drafted": p.drafted, "accepted": p.accepted,
                "draft_ms": round(p.draft_ms, 3), "verify_ms": round(p.verify_ms, 3)}

    # -- logprobs ----------------------------------------------------------------------------------
    def logprobs(self, entries: list[TokenLogprob], index: int = 0) -> dict:
        """Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions: the legacy columns."""
        if self.chat:
            return {"content": chat_logprobs(entries, self.token_text)}
        tokens = [self.token_text(entry.token) for entry in entries]
        offsets = []
        for text in tokens:
            offsets.append(self.text_offsets[index])
            self.text_offsets[index] += len(text)
        return {"tokens": tokens, "token_logprobs": [finite(entry.logprob) for entry in entries],
                "top_logprobs": [{self.token_text(token): finite(value) for token, value in entry.top}
                                 for entry in entries],
                "text_offset": offsets}



def chat_logprobs(entries: list[TokenLogprob], token_text: Callable[[int], str]) -> list[dict]:
    """Each token's {token, logprob, bytes, top_logprobs}: OpenAI chat's `logprobs.content`, and Ollama's
    `logprobs` as they are."""
    return [{**token_entry(entry.token, entry.logprob, token_text),
             "top_logprobs": [token_entry(token, value, token_text) for token, value in entry.top]}
            for entry in entries]


def token_entry(token: int, logprob: float, token_text: Callable[[int], str]) -> dict:
    text = token_text(token)
    return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode("utf-8"))}


def finite(logprob: float) -> float:
    """A log-probability JSON can carry: impossible tokens (-inf) as -9999.0, as OpenAI reports them."""
    return max(logprob, -9999.0)
