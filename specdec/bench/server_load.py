"""Load check for `specdec serve`: many concurrent streaming clients, TTFT percentiles, throughput, memory.

    specdec serve --target smollm2-135m-instruct &
    python -m specdec.bench.server_load --url http://127.0.0.1:8000/v1 --clients 64 --max-tokens 64

Prompts come from the benchmark tasks (Spec-Bench + code), cycled. Memory is the server's resident set
size from its /metrics (process_resident_memory_bytes), read before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import openai

from specdec.errors import SpecdecError
from specdec.bench.tasks import load_prompts


@dataclass
class ClientRun:
    ok: bool
    error: str
    time_to_first_token: float
    seconds: float
    completion_tokens: int


@dataclass
class LoadReport:
    clients: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    seconds: float
    completion_tokens: int
    tokens_per_second: float  # all clients' tokens / wall time of the whole check
    per_client_tokens_per_second_p50: float
    rss_before_mb: float
    rss_after_mb: float


def resident_mb(base_url: str) -> float:
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        text = urllib.request.urlopen(f"{root}/metrics", timeout=30).read().decode()
    except urllib.error.HTTPError:  # a peer server without Prometheus metrics (llama.cpp's by default)
        return float("nan")
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1]) / 1e6
    return float("nan")


def one_client(client: openai.OpenAI, model: str, messages: list[dict], max_tokens: int) -> ClientRun:
    started = time.perf_counter()
    first = None
    try:
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        tokens = 0
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return ClientRun(True, "", first or float("nan"), time.perf_counter() - started, tokens)
    except openai.OpenAIError as exc:
        return ClientRun(False, str(exc), float("nan"), time.perf_counter() - started, 0)


def run_load(base_url: str, clients: int, max_tokens: int) -> tuple[LoadReport, list[ClientRun]]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    model = client.models.list().data[0].id
    prompts = load_prompts(["code", "mt_bench", "qa", "summarization"], 16)
    rss_before = resident_mb(base_url)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda i: one_client(client, model, [{"role": "user", "content":
                                                                  prompts[i % len(prompts)].prompt}], max_tokens),
                             range(clients)))
    seconds = time.perf_counter() - started
    ok = [r for r in runs if r.ok]
    ttfts = sorted(r.time_to_first_token for r in ok)
    tokens = sum(r.completion_tokens for r in ok)
    report = LoadReport(
        clients=clients, errors=len(runs) - len(ok),
        ttft_p50=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99=ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan"),
        seconds=seconds, completion_tokens=tokens, tokens_per_second=tokens / seconds,
        per_client_tokens_per_second_p50=statistics.median(r.completion_tokens / r.seconds for r in ok) if ok else 0,
        rss_before_mb=rss_before, rss_after_mb=resident_mb(base_url),
    )
    return report, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    try:
        report, runs = run_load(args.url, args.clients, args.max_tokens)
    except SpecdecError as exc:
        raise SystemExit(f"server_load: error: {exc}") from None
    except (openai.APIConnectionError, OSError) as exc:
        raise SystemExit(f"server_load: error: cannot reach {args.url} ({exc})") from None
    print(json.dumps(asdict(report), indent=1))
    for run in runs:
        if not run.ok:
            print("error:", run.error)


if __name__ == "__main__":
    main()
