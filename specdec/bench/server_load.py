"""Load check for an OpenAI-compatible server: many concurrent streaming clients; throughput, time to first
token, time per output token and inter-chunk latency percentiles, memory.

    specdec serve --target smollm2-135m-instruct &
    python -m specdec.bench.server_load --url http://127.0.0.1:8000/v1 --clients 64 --max-tokens 64

(`specdec bench serve` starts the servers itself, ours and llama.cpp's, and runs this against each.)
Prompts come from the benchmark tasks (Spec-Bench + code), cycled; `--system-prompt` puts the same system
message before each (what a served application sends, and what a prefix cache serves). Memory is the
server's resident set size from its /metrics (process_resident_memory_bytes), read before and after.
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
    chunk_gaps: tuple[float, ...] = ()  # seconds between the stream's text chunks

    @property
    def time_per_output_token(self) -> float:
        """Seconds per token after the first (a speculative chunk carries several tokens)."""
        if self.completion_tokens < 2:
            return float("nan")
        return (self.seconds - self.time_to_first_token) / (self.completion_tokens - 1)


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
    tpot_p50: float = float("nan")  # time per output token after the first, per client
    tpot_p99: float = float("nan")
    itl_p50: float = float("nan")  # gaps between streamed chunks, all clients together
    itl_p99: float = float("nan")


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
        tokens, last, gaps = 0, None, []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.perf_counter()
                if first is None:
                    first = now - started
                else:
                    gaps.append(now - last)
                last = now
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return ClientRun(True, "", first or float("nan"), time.perf_counter() - started, tokens, tuple(gaps))
    except openai.OpenAIError as exc:
        return ClientRun(False, str(exc), float("nan"), time.perf_counter() - started, 0)


DEFAULT_TASKS = ("code", "mt_bench", "qa", "summarization")  # all but code need Spec-Bench's questions


def run_load(base_url: str, clients: int, max_tokens: int, system_prompt: str | None = None,
             tasks: tuple[str, ...] = DEFAULT_TASKS) -> tuple[LoadReport, list[ClientRun]]:
    prompts = load_prompts(list(tasks), 16)  # before any request: a missing data file is one clear error
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    model = client.models.list().data[0].id
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def messages(i: int) -> list[dict]:
        return [*system, {"role": "user", "content": prompts[i % len(prompts)].prompt}]

    rss_before = resident_mb(base_url)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda i: one_client(client, model, messages(i), max_tokens), range(clients)))
    seconds = time.perf_counter() - started
    ok = [r for r in runs if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    ttft_p50, ttft_p99 = percentiles([r.time_to_first_token for r in ok])
    tpot_p50, tpot_p99 = percentiles([r.time_per_output_token for r in ok])
    itl_p50, itl_p99 = percentiles([gap for r in ok for gap in r.chunk_gaps])
    report = LoadReport(
        clients=clients, errors=len(runs) - len(ok), ttft_p50=ttft_p50, ttft_p99=ttft_p99,
        seconds=seconds, completion_tokens=tokens, tokens_per_second=tokens / seconds,
        per_client_tokens_per_second_p50=statistics.median(r.completion_tokens / r.seconds for r in ok) if ok else 0,
        rss_before_mb=rss_before, rss_after_mb=resident_mb(base_url),
        tpot_p50=tpot_p50, tpot_p99=tpot_p99, itl_p50=itl_p50, itl_p99=itl_p99,
    )
    return report, runs


def percentiles(values: list[float]) -> tuple[float, float]:
    """(median, 99th percentile, nearest rank) of the values that are numbers; NaN when there are none."""
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), values[min(len(values) - 1, int(0.99 * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--system-prompt", default=None, help="a system message every client sends first")
    args = parser.parse_args()
    try:
        report, runs = run_load(args.url, args.clients, args.max_tokens, args.system_prompt)
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
