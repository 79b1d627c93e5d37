"""Certify a served configuration through its OpenAI-compatible API (specdec serve, llama.cpp's server,
vLLM, ...): the endpoint's speculative output against the same model decoded without speculation.

The reference is either the same specdec server with speculation switched off per request (its
`speculative` extension, detected from the `specdec` stats in its replies) or a second URL serving the
same model without speculation (`--reference`). Only text comes back, so outcomes are texts: greedy
replies must be equal; sampled replies (`max_tokens` = the joint length, one seed per draw) are compared
with the reference's on other seeds by the homogeneity test. With a reference of another engine, numerics
differ (kernels, batching), so a small difference there is evidence of different arithmetic, not of a
lossy speculation: the report says which kind of reference it had.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from specdec.bench.tasks import BenchPrompt
from specdec.certify.local import END, OTHER_SEEDS, CertifyReport, CertifySettings, GreedyCase, SampledCase
from specdec.certify.statistics import homogeneity
from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams

CONCURRENT_REQUESTS = 4
TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class Endpoint:
    url: str  # the server's base URL, with or without /v1
    model: str
    api_key: str | None = None
    extra: dict = field(default_factory=dict)  # fields added to every request body

    def complete(self, prompt: BenchPrompt, params: SamplingParams, max_tokens: int, seed: int | None) -> dict:
        """One non-streamed completion (chat prompts through /chat/completions): the reply's JSON."""
        base = self.url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": params.temperature,
                "top_p": params.top_p, **self.extra}
        if seed is not None:
            body["seed"] = seed
        for name, value, neutral in (("top_k", params.top_k, 0), ("min_p", params.min_p, 0.0),
                                     ("repetition_penalty", params.repetition_penalty, 1.0)):
            if value != neutral:  # non-standard fields only when set: not every server takes them
                body[name] = value
        if prompt.chat:
            route, body["messages"] = "/chat/completions", [{"role": "user", "content": prompt.prompt}]
        else:
            route, body["prompt"] = "/completions", prompt.prompt
        request = urllib.request.Request(base + route, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:200]
            raise SpecdecError(f"{base + route}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
            raise SpecdecError(f"{base + route}: no usable reply ({error})") from None


def reply_outcome(reply: dict) -> tuple[str, ...]:
    """The reply's text as a sequence of characters (so rare replies pool into their common beginnings,
    statistics.pool_by_prefix), ending in END where the server stopped before max_tokens."""
    choice = reply["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return (*text, END) if choice.get("finish_reason") == "stop" else tuple(text)


def reference_for(endpoint: Endpoint, reference_url: str | None, probe: dict) -> tuple[Endpoint, str]:
    """The non-speculative reference and what kind it is ("same server" or "other server")."""
    if reference_url:
        return Endpoint(reference_url, endpoint.model, endpoint.api_key), "other server"
    if "specdec" in probe:
        return Endpoint(endpoint.url, endpoint.model, endpoint.api_key, {"speculative": {"enabled": False}}), "same server"
    raise SpecdecError(f"{endpoint.url} cannot switch speculation off per request (not a specdec server): "
                       "give --reference URL, the same model served without speculation")


def certify_endpoint(endpoint: Endpoint, reference_url: str | None, prompts: Sequence[BenchPrompt],
                     params: SamplingParams, settings: CertifySettings, configuration: dict,
                     progress: Callable[[int], None] = lambda n: None) -> CertifyReport:
    if not prompts:
        raise SpecdecError("no prompts to certify on")
    greedy = SamplingParams()
    probe = endpoint.complete(prompts[0], greedy, settings.greedy_tokens, None)
    reference, kind = reference_for(endpoint, reference_url, probe)
    report = CertifyReport({**configuration, "reference": f"{kind} ({reference.url})"}, settings)
    for index, prompt in enumerate(prompts):
        ours = reply_outcome(probe if index == 0 else endpoint.complete(prompt, greedy, settings.greedy_tokens, None))
        theirs = reply_outcome(reference.complete(prompt, greedy, settings.greedy_tokens, None))
        if ours == theirs:
            report.greedy.append(GreedyCase(prompt.prompt_id, settings.greedy_tokens, "identical"))
        else:  # no logits through the API: a difference cannot be told from a tie
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            report.greedy.append(GreedyCase(prompt.prompt_id, settings.greedy_tokens, "mismatch", first))
        progress(1)
    if params.greedy:
        return report
    sampled = prompts[:settings.sampled_prompts]
    level = settings.alpha / max(1, len(sampled))
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        for prompt in sampled:
            def draw(server: Endpoint, seed: int) -> str:
                outcome = reply_outcome(server.complete(prompt, params, settings.joint_tokens, seed))
                progress(1)
                return outcome

            seeds = [settings.seed + i for i in range(settings.samples)]
            ours = list(pool.map(lambda seed: draw(endpoint, seed), seeds))
            theirs = list(pool.map(lambda seed: draw(reference, seed + OTHER_SEEDS), seeds))
            count = lambda outcomes: {o: outcomes.count(o) for o in set(outcomes)}  # noqa: E731
            report.sampled.append(SampledCase(prompt.prompt_id, joint=homogeneity(count(ours), count(theirs), level),
                                              draws=settings.samples))
    return report
