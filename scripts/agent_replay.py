"""Replay a recorded agent session (`scripts/agent_programs.py --record FILE`: the chat-completion requests an
agent sent, in order) against servers, greedy, and compare them: wall time and first-token time per request,
decode tokens/s, and whether every answer is identical to the first server's (run plain decoding first).

    python scripts/agent_replay.py session.json --server plain=http://127.0.0.1:8775 \\
        --server specdec=http://127.0.0.1:8776 [--json out.json] [--reference earlier.json]

--reference compares the answers with an earlier replay's (its first server's), so that servers run one at
a time on the machine (each measured alone) are still compared with their own plain decoding.

Each request is sent as recorded, streamed, with `temperature: 0` (and `seed: 0`) so that every server's
answer is its model's greedy one, and `max_tokens` at most --max-tokens (agents ask for 32,000: a greedy
loop would run that long); `model` is set to the server's first listed model. A server that refuses a
request is reported with its status, not retried.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import openai


@dataclass
class Reply:
    index: int
    prompt_tokens: int
    completion_tokens: int
    first_token_seconds: float | None  # None: nothing was streamed
    seconds: float
    answer: str  # the text and the tool calls, as one string to compare
    error: str = ""
    # the server's own `timings` (llama-server's object; specdec's with timings_per_token): prompt_n,
    # prompt_ms, predicted_n, predicted_ms, draft_n, draft_n_accepted
    timings: dict | None = None


def replay(session: list[dict], url: str, max_tokens: int) -> list[Reply]:
    client = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="unused", timeout=3600, max_retries=0)
    model = client.models.list().data[0].id
    replies = []
    for index, request in enumerate(session):
        if request["route"] != "/v1/chat/completions":
            raise SystemExit(f"request {index}: {request['route']} (this replay sends chat completions only)")
        body = {**request["body"], "model": model, "temperature": 0, "seed": 0, "stream": True,
                "stream_options": {"include_usage": True}, "timings_per_token": True}
        body.pop("top_p", None)
        body["max_tokens"] = min(body.get("max_tokens") or max_tokens, max_tokens)
        replies.append(send(client, index, body))
        print(f"{url} request {index}: {replies[-1].seconds:.1f} s, {replies[-1].completion_tokens} tokens "
              f"{replies[-1].error}", flush=True)
    return replies


def send(client: openai.OpenAI, index: int, body: dict) -> Reply:
    started, first, text, calls, usage, timings = time.perf_counter(), None, [], {}, None, None
    extra = {key: body.pop(key) for key in ("timings_per_token",)}
    try:
        for chunk in client.chat.completions.create(**body, extra_body=extra):
            if chunk.usage is not None:
                usage = chunk.usage
            timings = (chunk.model_extra or {}).get("timings") or timings
            for choice in chunk.choices:
                delta = choice.delta
                if (delta.content or delta.tool_calls) and first is None:
                    first = time.perf_counter() - started
                text.append(delta.content or "")
                for call in delta.tool_calls or []:
                    name, arguments = calls.get(call.index, ("", ""))
                    calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    except openai.APIStatusError as error:
        return Reply(index, 0, 0, None, time.perf_counter() - started, "", f"HTTP {error.status_code}")
    answer = "".join(text) + "".join(f"\n<call {name}({arguments})>" for name, arguments in calls.values())
    return Reply(index, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0, first,
                 time.perf_counter() - started, answer, timings=timings)


def summary(name: str, replies: list[Reply], reference: list[Reply]) -> dict:
    """Totals for one server, its answers compared with the reference server's. Decode speed and prompt
    time come from the server's own timings (a streamed reply may hold its text back, e.g. while it could
    still be a tool call, so the client's first-token time says little)."""
    ok = [r for r in replies if not r.error]
    seconds = sum(r.seconds for r in ok)
    same = sum(r.answer == ref.answer and not r.error for r, ref in zip(replies, reference))
    timed = [r.timings for r in ok if r.timings]
    predicted_ms = sum(t.get("predicted_ms", 0) for t in timed)
    row = {"server": name, "requests": len(replies), "refused": len(replies) - len(ok),
           "wall_seconds": round(seconds, 1), "completion_tokens": sum(r.completion_tokens for r in ok),
           "tokens_per_second": round(sum(r.completion_tokens for r in ok) / seconds, 2) if seconds else None,
           "identical_to_reference": f"{same}/{len(replies)}"}
    if timed:
        row |= {"decode_tokens_per_second": round(sum(t.get("predicted_n", 0) for t in timed) / predicted_ms * 1e3, 2)
                if predicted_ms else None,
                "prompt_seconds_per_request": [round(t.get("prompt_ms", 0) / 1e3, 2) for t in timed],
                "prompt_tokens_computed": [t.get("prompt_n") for t in timed],
                "drafted": sum(t.get("draft_n", 0) for t in timed),
                "accepted": sum(t.get("draft_n_accepted", 0) for t in timed)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("session", type=Path, help="the recorded session (agent_programs.py --record)")
    parser.add_argument("--server", action="append", required=True, metavar="NAME=URL",
                        help="a server to replay against (repeat; the first is the reference)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=1024, help="the most tokens a reply may have")
    parser.add_argument("--reference", type=Path, default=None,
                        help="an earlier replay's --json whose first server's answers these are compared with")
    args = parser.parse_args()
    session = json.loads(args.session.read_text())
    servers = [item.split("=", 1) for item in args.server]
    if any(len(server) != 2 for server in servers):
        parser.error("--server takes NAME=URL")
    results = {name: replay(session, url, args.max_tokens) for name, url in servers}
    if args.reference is not None:
        earlier = json.loads(args.reference.read_text())["replies"]
        reference = [Reply(**reply) for reply in next(iter(earlier.values()))]
    else:
        reference = results[servers[0][0]]
    table = [summary(name, replies, reference) for name, replies in results.items()]
    for row in table:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"summary": table, "replies": {name: [asdict(r) for r in replies]
                                                                      for name, replies in results.items()}},
                                        indent=1))


if __name__ == "__main__":
    main()
