"""`specdec serve`: the OpenAI-compatible server, driven by the official `openai` client over loopback."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.api.generator import SpeculativeGenerator
from specdec.server.app import ServerSettings, create_app
from specdec.server.run import bind_socket, make_server

MESSAGES = [{"role": "user", "content": "hello there"}]


class RunningServer:
    def __init__(self, generator: SpeculativeGenerator, grace: float = 10.0, catalog=None, **settings):
        self.generator = generator
        self.app = create_app(generator, ServerSettings("tiny", **settings), catalog)
        sock = bind_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.server = make_server(self.app, shutdown_grace=grace, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0)

    def request(self, method: str, path: str, body: str | bytes | None = None) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode()

    def metrics(self) -> dict[str, float]:
        status, text = self.request("GET", "/metrics")
        assert status == 200
        return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
                if not s.labels}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


class SlowModel:
    """The tiny model with a pause in every forward, so a generation lasts long enough to interrupt."""

    def __init__(self, model, pause: float):
        self._model, self._pause = model, pause

    def forward(self, *args, **kwargs):
        time.sleep(self._pause)
        return self._model.forward(*args, **kwargs)

    def forward_batch(self, *args, **kwargs):  # the server's rounds: one batched forward
        time.sleep(self._pause)
        return self._model.forward_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.fixture(scope="module")
def server(tiny_generator):
    running = RunningServer(tiny_generator, max_active=4, max_queue=64)
    yield running
    running.stop()


def slow_server(generator: SpeculativeGenerator, pause: float = 0.02, grace: float = 10.0, **settings) -> RunningServer:
    target = dataclasses.replace(generator.target, model=SlowModel(generator.target.model, pause))
    return RunningServer(SpeculativeGenerator(target, generator.drafter, 4), grace, **settings)


def test_chat_greedy_matches_the_library_and_reports_exact_usage(server, tiny_generator):
    expected = tiny_generator.generate(MESSAGES, 40)
    reply = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == len(tiny_generator.encode(MESSAGES))
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stats = reply.model_extra["specdec"]
    assert stats["drafter"] == "ngram" and stats["rounds"] >= 1 and stats["tau"] >= 1


def test_greedy_output_equals_specdec_generate(server, tiny_dirs, capsys):
    from specdec.cli import main

    assert main(["generate", "hello there", "--target", str(tiny_dirs["llama"]), "--drafter", "ngram", "--k", "4",
                 "--max-new-tokens", "40", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    reply = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0)
    assert reply.choices[0].message.content == cli["text"]
    assert reply.usage.completion_tokens == len(cli["token_ids"])


def test_streamed_text_equals_non_streamed_text_for_the_same_seed(server):
    kwargs = dict(model="tiny", max_tokens=48, temperature=0.9, top_p=0.95, seed=11)
    whole = server.client.completions.create(prompt="the cat sat on", **kwargs)
    parts = list(server.client.completions.create(prompt="the cat sat on", stream=True, **kwargs))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    chat_whole = server.client.chat.completions.create(messages=MESSAGES, **kwargs)
    chat_parts = list(server.client.chat.completions.create(messages=MESSAGES, stream=True, **kwargs))
    assert chat_parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in chat_parts) == chat_whole.choices[0].message.content
    other_seed = server.client.completions.create(prompt="the cat sat on", **{**kwargs, "seed": 12})
    assert other_seed.choices[0].text != whole.choices[0].text  # the seed is actually used


def test_a_seed_gives_plain_sampling_text_whatever_runs_beside_it(server, tiny_generator):
    """Seeded requests sent together (one batch of interleaved generations) each return the text plain
    sampling returns for that seed alone: a request's random numbers are its own and keyed by position."""
    from concurrent.futures import ThreadPoolExecutor

    plain = SpeculativeGenerator(tiny_generator.target, None)
    kwargs = dict(max_tokens=32, temperature=0.8, top_p=0.95)
    expected = {seed: plain.generate("the cat sat on", 32, chat=False, seed=seed, temperature=0.8, top_p=0.95).text
                for seed in (1, 2, 3, 4, 5, 6)}

    def ask(seed):
        return server.client.completions.create(model="tiny", prompt="the cat sat on", seed=seed, **kwargs)

    with ThreadPoolExecutor(6) as pool:
        replies = dict(zip(expected, pool.map(ask, expected)))
    assert {seed: reply.choices[0].text for seed, reply in replies.items()} == expected


def test_stream_format_usage_chunk_and_done(server):
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    status, text = server.request("POST", "/v1/chat/completions", json.dumps(body))
    assert status == 200
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in text.split("\n\n") if line)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_stop_strings_and_speculation_switched_off_per_request(server, tiny_generator):
    expected = tiny_generator.generate(MESSAGES, 40)
    stop = expected.text[10:13]
    reply = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
                                                  stop=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == expected.text[: expected.text.index(stop)]
    plain = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
                                                  extra_body={"speculative": {"enabled": False}})
    assert plain.choices[0].message.content == expected.text
    assert plain.model_extra["specdec"]["drafter"] == "none"
    fixed = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
                                                  extra_body={"speculative": {"k": 2}})
    assert fixed.choices[0].message.content == expected.text
    capped = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
                                                   extra_body={"speculative": {"k": "auto:3"}})
    assert capped.choices[0].message.content == expected.text


def test_models_health_and_metrics(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    status, text = server.request("GET", "/health")
    assert status == 200 and json.loads(text)["status"] == "ok"
    before = server.metrics()
    server.client.completions.create(model="tiny", prompt="abc", max_tokens=10, temperature=0)
    after = server.metrics()
    assert after["specdec_generated_tokens_total"] - before["specdec_generated_tokens_total"] == 10
    assert after["specdec_prompt_tokens_total"] > before["specdec_prompt_tokens_total"]
    assert after["specdec_rounds_total"] > before["specdec_rounds_total"]
    assert 0 <= after["specdec_acceptance_rate"] <= 1 and after["specdec_tau"] >= 1
    assert after["specdec_tokens_per_second"] > 0
    assert after["specdec_queue_length"] == 0 and after["specdec_active_generations"] == 0


def test_concurrent_requests_run_in_batched_rounds_and_each_gets_its_own_output(server, tiny_generator):
    """The worker verifies the active generations' drafts in one pass per round (/metrics shows rounds of
    several generations); each request still gets exactly its own greedy output."""
    import concurrent.futures

    prompts = ["abc", "hello hello", "the world", "x y z x y z", "again and again"]
    expected = [tiny_generator.generate(p, 40, chat=False).text for p in prompts]
    before = server.metrics()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: server.client.completions.create(model="tiny", prompt=p, max_tokens=40,
                                                                           temperature=0), prompts))
    assert [r.choices[0].text for r in replies] == expected
    after = server.metrics()
    rounds = after["specdec_batch_generations_count"] - before["specdec_batch_generations_count"]
    generations = after["specdec_batch_generations_sum"] - before["specdec_batch_generations_sum"]
    assert rounds > 0 and generations / rounds > 1.2  # most rounds carried more than one request
    assert after["specdec_batch_rows_sum"] - before["specdec_batch_rows_sum"] >= generations


def test_a_shared_prefix_is_computed_once_and_changes_nothing(tiny_generator):
    """A second prompt with the same system prompt, and the next turn of a conversation (its history resent),
    copy the shared prefix's keys and values (/metrics counts them) and get exactly the library's output; each
    reply says how many of its prompt tokens came from the cache (usage's cached_tokens, llama-server's
    cache_n beside prompt_n, the tokens computed)."""
    running = RunningServer(tiny_generator, max_active=4)
    try:
        system = {"role": "system", "content": "You answer in short sentences, and you never make things up."}
        first = [system, {"role": "user", "content": "hello there"}]
        second = [system, {"role": "user", "content": "what is new"}]
        reused = [0.0]

        def ask(messages):
            reply = running.client.chat.completions.create(model="tiny", messages=messages, max_tokens=30,
                                                           temperature=0, extra_body={"timings_per_token": True})
            now = running.metrics().get("specdec_prefix_cache_reused_tokens", 0.0)
            cached, reused[0] = now - reused[0], now
            timings = reply.model_extra["timings"]
            assert reply.usage.prompt_tokens_details.cached_tokens == timings["cache_n"] == cached
            assert timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
            return reply.choices[0].message.content

        answer = ask(first)
        assert running.metrics()["specdec_prefix_cache_hits"] == 0
        assert ask(second) == tiny_generator.generate(second, 30).text
        after_second = running.metrics()
        assert after_second["specdec_prefix_cache_hits"] == 1 and after_second["specdec_prefix_cache_reused_tokens"] >= 16
        third = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
        assert ask(third) == tiny_generator.generate(third, 30).text
        after_third = running.metrics()
        first_prompt = len(tiny_generator.encode(first))
        assert after_third["specdec_prefix_cache_reused_tokens"] - after_second["specdec_prefix_cache_reused_tokens"] >= first_prompt
        assert after_third["specdec_prefix_cache_bytes"] > 0
        # the same conversation through the Responses and Anthropic dialects: the cache's share in their usage
        status, text = running.request("POST", "/v1/responses", json.dumps(
            {"model": "tiny", "input": third, "max_output_tokens": 4, "temperature": 0}))
        assert status == 200 and json.loads(text)["usage"]["input_tokens_details"]["cached_tokens"] >= first_prompt
        status, text = running.request("POST", "/v1/messages", json.dumps(
            {"model": "tiny", "system": system["content"], "messages": third[1:], "max_tokens": 4}))
        usage = json.loads(text)["usage"]
        assert status == 200 and usage["cache_read_input_tokens"] >= first_prompt
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(tiny_generator.encode(third))
        # streamed: the chat stream's usage chunk and the Anthropic stream's message_delta carry the same split
        chunks = list(running.client.chat.completions.create(
            model="tiny", messages=third, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= first_prompt
        status, text = running.request("POST", "/v1/messages", json.dumps(
            {"model": "tiny", "system": system["content"], "messages": third[1:], "max_tokens": 4, "stream": True}))
        delta = next(json.loads(line.removeprefix("data: ")) for line in text.splitlines()
                     if line.startswith("data: ") and '"message_delta"' in line)
        assert status == 200 and delta["usage"] == {**usage, "output_tokens": delta["usage"]["output_tokens"]}
    finally:
        running.stop()


def test_kv_memory_budget_queues_requests_refuses_one_too_large_and_frees_every_byte(tiny_generator):
    from specdec.core.commit import StopCriteria
    from specdec.core.sampling import SamplingParams

    prompt = "a budget for one"
    ids = tiny_generator.encode(prompt, chat=False)
    one = tiny_generator.request_engine().start(ids, SamplingParams(), StopCriteria(24, frozenset()),
                                               tiny_generator.target.tokenizer).cache.nbytes
    running = RunningServer(tiny_generator, max_active=4, kv_memory_bytes=one + one // 2, prefix_cache_bytes=0)
    try:
        expected = tiny_generator.generate(prompt, 24, chat=False).text
        with ThreadPoolExecutor(3) as pool:  # only one fits at a time: the others wait, none is refused
            replies = list(pool.map(lambda _: running.client.completions.create(
                model="tiny", prompt=prompt, max_tokens=24, temperature=0), range(3)))
        assert [r.choices[0].text for r in replies] == [expected] * 3
        metrics = running.metrics()
        assert metrics["specdec_batch_generations_sum"] == metrics["specdec_batch_generations_count"]  # one at a time
        assert metrics["specdec_kv_cache_bytes"] == 0 and metrics["specdec_kv_cache_budget_bytes"] == one + one // 2
        assert "specdec_prefix_cache_hits" not in metrics  # --prefix-cache 0: off
        status, text = running.request("POST", "/v1/completions",
                                       json.dumps({"prompt": prompt, "max_tokens": 300}))
        assert status == 400 and "KV cache" in json.loads(text)["error"]["message"]
    finally:
        running.stop()


LONG_PROMPT = "x" * 600  # the tiny model's context is 512 tokens; one byte = one token here
BAD_REQUESTS = {
    "malformed json": ("/v1/chat/completions", '{"messages": ['),
    "not an object": ("/v1/chat/completions", "[1, 2]"),
    "empty body": ("/v1/chat/completions", ""),
    "missing messages": ("/v1/chat/completions", {"model": "tiny"}),
    "empty messages": ("/v1/chat/completions", {"messages": []}),
    "message without role": ("/v1/chat/completions", {"messages": [{"content": "hi"}]}),
    "unknown role": ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    "content not a string": ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}),
    "image content": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
    "max_tokens zero": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0}),
    "max_tokens negative": ("/v1/completions", {"prompt": "a", "max_tokens": -5}),
    "max_completion_tokens zero": ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}),
    "max_tokens string": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": "10"}),
    "max_tokens float": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1.5}),
    "temperature too high": ("/v1/chat/completions", {"messages": MESSAGES, "temperature": 2.5}),
    "temperature negative": ("/v1/chat/completions", {"messages": MESSAGES, "temperature": -0.1}),
    "temperature NaN": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], '
                                                '"temperature": NaN}'),
    "temperature Infinity": ("/v1/completions", '{"prompt": "hi", "temperature": Infinity}'),
    "temperature string": ("/v1/chat/completions", {"messages": MESSAGES, "temperature": "hot"}),
    "top_p zero": ("/v1/chat/completions", {"messages": MESSAGES, "top_p": 0}),
    "top_p above one": ("/v1/completions", {"prompt": "a", "top_p": 1.5}),
    "top_k negative": ("/v1/completions", {"prompt": "a", "top_k": -1}),
    "seed string": ("/v1/completions", {"prompt": "a", "seed": "abc"}),
    "stream not bool": ("/v1/completions", {"prompt": "a", "stream": "yes"}),
    "too many stops": ("/v1/completions", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}),
    "stop not string": ("/v1/completions", {"prompt": "a", "stop": 7}),
    "n above the cap": ("/v1/chat/completions", {"messages": MESSAGES, "n": 17}),
    "n zero": ("/v1/completions", {"prompt": "a", "n": 0}),
    "top_logprobs without logprobs": ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}),
    "top_logprobs above 20": ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}),
    "completion logprobs above 5": ("/v1/completions", {"prompt": "a", "logprobs": 6}),
    "a tool without its function": ("/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}),
    "tools for a template without them": ("/v1/chat/completions", {"messages": MESSAGES, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
    "tool_choice naming no tool": ("/v1/chat/completions", {"messages": MESSAGES, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    "tool_choice required without tools": ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}),
    "response_format of an unknown type": ("/v1/chat/completions", {"messages": MESSAGES,
                                                                    "response_format": {"type": "xml"}}),
    "json_schema without a schema": ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}),
    "an invalid regex grammar": ("/v1/completions", {"prompt": "a", "grammar": "root ::= ("}),
    "two output formats": ("/v1/completions", {"prompt": "a", "grammar": 'root ::= "a"',
                                               "json_schema": {"type": "object"}}),
    "suffix on a model without FIM tokens": ("/v1/completions", {"prompt": "a", "suffix": "b"}),
    "an assistant message without content or calls": ("/v1/chat/completions", {"messages": [
        {"role": "assistant"}]}),
    "presence penalty": ("/v1/completions", {"prompt": "a", "presence_penalty": 0.5}),
    "missing prompt": ("/v1/completions", {"max_tokens": 3}),
    "empty prompt": ("/v1/completions", {"prompt": ""}),
    "several prompts": ("/v1/completions", {"prompt": ["a", "b"]}),
    "token id out of range": ("/v1/completions", {"prompt": [1, 2, 100000]}),
    "prompt longer than the context": ("/v1/completions", {"prompt": LONG_PROMPT}),
    "chat longer than the context": ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_PROMPT}]}),
    "speculative k zero": ("/v1/completions", {"prompt": "a", "speculative": {"k": 0}}),
    "speculative k not auto:N": ("/v1/completions", {"prompt": "a", "speculative": {"k": "auto:0"}}),
    "speculative k a word": ("/v1/completions", {"prompt": "a", "speculative": {"k": "many"}}),
    "speculative k a number in a string": ("/v1/completions", {"prompt": "a", "speculative": {"k": "5"}}),
    "speculative unknown field": ("/v1/completions", {"prompt": "a", "speculative": {"depth": 3}}),
    # issue 25: each of these used to get a 500
    "seed of 2^64": ("/v1/completions", {"prompt": "a", "seed": 2**64}),
    "seed far below -2^63": ("/v1/completions", {"prompt": "a", "seed": -(2**70)}),
    "lone surrogate in the prompt": ("/v1/completions", '{"prompt": "abc \\ud800", "max_tokens": 4}'),
    "lone surrogate in a message": ("/v1/chat/completions",
                                    '{"messages": [{"role": "user", "content": "abc \\udfff"}], "max_tokens": 4}'),
    "JSON nested 200,000 deep": ("/v1/completions", "[" * 200_000 + "]" * 200_000),
    "one empty prompt in a list": ("/v1/completions", {"prompt": [""]}),
    "stop string of 300 characters": ("/v1/completions", {"prompt": "a", "stop": ["x" * 300]}),
    # issue 52: each of these used to get a 500, or a 200 with a wrong answer
    "seed of 5,000 digits": ("/v1/completions", '{"prompt": "a", "seed": ' + "9" * 5000 + "}"),
    "an ignored field of 5,000 digits": ("/v1/completions", '{"prompt": "a", "user": -' + "9" * 5000 + "}"),
    "a schema minimum of 5,000 digits": ("/v1/completions", '{"prompt": "a", "json_schema": {"type": "integer", '
                                         '"minimum": ' + "1" * 5000 + "}}"),
    "a schema minimum of 60 digits": ("/v1/completions", {"prompt": "a", "json_schema": {"type": "integer",
                                                                                        "minimum": 10**59}}),
    "NaN in an ignored field": ("/v1/completions", '{"prompt": "a", "user": NaN}'),
    "a number past float range": ("/v1/completions", '{"prompt": "a", "user": 1e999}'),
    "lone surrogate in an ignored field's key": ("/v1/completions", '{"prompt": "a", "\\udc00": 1}'),
    "JSON nested 100 deep": ("/v1/completions", '{"prompt": "a", "user": ' + "[" * 100 + "]" * 100 + "}"),
    "a recursive $ref schema": ("/v1/completions", {"prompt": "a", "json_schema": {
        "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}),
    "a $ref cycle a -> b -> a": ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}}}}),
    "a pattern the grammar engine gives up on": ("/v1/completions", {"prompt": "a", "json_schema": {
        "type": "string", "pattern": "^a{1000000}$"}}),
    "a pattern repeated a million times": ("/v1/completions", {"prompt": "a", "json_schema": {
        "type": "string", "pattern": "^(a{1000}){1000}$"}}),
    "a GBNF grammar with a missing rule": ("/v1/completions", {"prompt": "a", "grammar": "root ::= missing"}),
    "a GBNF grammar cut short": ("/v1/completions", {"prompt": "a", "grammar": "root ::= ("}),
}

# Wrong types and values for every field a client sets, on both endpoints: each one a 400.
FIELD_BAD_VALUES = {
    "max_tokens": ["ten", [1], {"n": 1}, True, 0, -1, 2.5],
    "temperature": ["warm", [1], True, -1, 3],
    "top_p": ["most", {"p": 1}, 0, 1.01, -0.5],
    "top_k": ["five", -2, 1.5, True],
    "min_p": ["x", 1, -0.1],
    "repetition_penalty": ["x", 0, -1],
    "seed": ["seven", 1.5, [1]],
    "stop": [7, True, {"s": "x"}, [1, 2], ["a", 3]],
    "stream": ["yes", 1, [True]],
    "speculative": ["on", 1, {"enabled": "yes"}, {"k": -3}, {"k": 1.5}],
}
for field, values in FIELD_BAD_VALUES.items():
    for index, value in enumerate(values):
        BAD_REQUESTS[f"{field} bad value {index} (completions)"] = ("/v1/completions", {"prompt": "a", field: value})
        BAD_REQUESTS[f"{field} bad value {index} (chat)"] = ("/v1/chat/completions", {"messages": MESSAGES,
                                                                                      field: value})
BAD_REQUESTS.update({
    "messages not a list": ("/v1/chat/completions", {"messages": {"role": "user", "content": "hi"}}),
    "message without content": ("/v1/chat/completions", {"messages": [{"role": "user"}]}),
    "message with an image part": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}),
    "message role unknown": ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    "prompt a number": ("/v1/completions", {"prompt": 5}),
    "prompt a list of lists": ("/v1/completions", {"prompt": [[1, 2]]}),
    "negative token id": ("/v1/completions", {"prompt": [1, -2]}),
    "body a JSON list": ("/v1/completions", "[1, 2]"),
    "body a JSON string": ("/v1/completions", '"hello"'),
    "body empty": ("/v1/completions", ""),
    "body truncated": ("/v1/completions", '{"prompt": "a"'),
})


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_gets_400_with_an_openai_error_body(server, case):
    path, body = BAD_REQUESTS[case]
    status, text = server.request("POST", path, body if isinstance(body, str) else json.dumps(body))
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"]
    if "context" in case:
        assert error["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404_as_openai_answers_it(server):
    status, text = server.request("POST", "/v1/chat/completions", json.dumps({"model": "gpt-4", "messages": MESSAGES}))
    error = json.loads(text)["error"]
    assert status == 404 and error["code"] == "model_not_found" and error["param"] == "model"
    assert "'gpt-4' is not served here" in error["message"]


def test_unknown_fields_are_ignored_and_wrong_routes_are_json_errors(server):
    status, text = server.request("POST", "/v1/completions",
                                  json.dumps({"prompt": "a", "max_tokens": 3, "user": "me", "x_custom": 1}))
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3
    status, text = server.request("GET", "/v1/chat/completions")
    assert status == 405 and "error" in json.loads(text)
    status, text = server.request("GET", "/v1/nothing")
    assert status == 404 and "error" in json.loads(text)


def test_sixteen_concurrent_clients_each_get_their_own_output(server, tiny_generator):
    prompts = [f"client {i} says {'ab' * i}" for i in range(16)]
    expected = [tiny_generator.generate(p, 30, chat=False).text for p in prompts]

    def ask(i: int) -> tuple[str, str]:
        if i % 2:
            stream = server.client.completions.create(model="tiny", prompt=prompts[i], max_tokens=30,
                                                      temperature=0, stream=True)
            return "".join(part.choices[0].text for part in stream), "stream"
        reply = server.client.completions.create(model="tiny", prompt=prompts[i], max_tokens=30, temperature=0)
        return reply.choices[0].text, "whole"

    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(ask, range(16)))
    assert [text for text, _ in outputs] == expected
    assert len(set(expected)) > 8  # the prompts really lead to different outputs


def test_disconnect_mid_stream_cancels_and_frees_the_slot(tiny_generator):
    running = slow_server(tiny_generator, max_active=1, max_queue=0)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        body = {"prompt": "abc", "max_tokens": 400, "temperature": 0, "stream": True}
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert response.read(6) == b"data: "  # generation is under way
        connection2 = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        connection2.request("POST", "/v1/completions", body=json.dumps({"prompt": "a", "max_tokens": 2}),
                            headers={"Content-Type": "application/json"})
        busy = connection2.getresponse()
        assert busy.status == 503 and json.loads(busy.read())["error"]["type"] == "server_busy"
        assert busy.getheader("Retry-After")
        connection.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 10
        while running.metrics()["specdec_active_generations"] > 0:
            assert time.monotonic() < deadline, "the cancelled generation still holds its slot"
            time.sleep(0.05)
        assert running.metrics()["specdec_generated_tokens_total"] == 0  # cancelled, not run to the end
        assert running.metrics()["specdec_kv_cache_bytes"] == 0  # its cache went with it
        reply = running.client.completions.create(model="tiny", prompt="a", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
    finally:
        running.stop()


def test_bench_serve_starts_a_server_drives_clients_and_reports(tiny_dirs, tmp_path, server, capsys):
    from specdec.cli import main

    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--target", str(tiny_dirs["llama"]), "--server-args", "--drafter ngram",
                 "--clients", "1,3", "--max-tokens", "6", "--tasks", "code", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["server"], r["clients"], r["errors"]) for r in rows] == [("specdec serve --drafter ngram", 1, 0),
                                                                         ("specdec serve --drafter ngram", 3, 0)]
    assert all(r["completion_tokens"] == 6 * r["clients"] and r["tokens_per_second"] > 0 for r in rows)
    assert all(r["ttft_p50"] > 0 and r["tpot_p50"] > 0 for r in rows)
    assert "| specdec serve --drafter ngram | 3 |" in capsys.readouterr().out
    # a running server (the module's) by URL; a server that cannot start is one line, not a traceback
    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{server.port}/v1", "--clients", "2",
                 "--max-tokens", "3", "--tasks", "code"]) == 0
    assert main(["bench", "serve", "--target", str(tmp_path / "missing"), "--clients", "1", "--tasks", "code"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("specdec: error: the server exited")


def test_graceful_shutdown_finishes_in_flight_requests(tiny_generator):
    running = slow_server(tiny_generator, pause=0.01, max_active=2)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(running.client.completions.create, model="tiny", prompt="abc", max_tokens=40,
                              temperature=0)
        deadline = time.monotonic() + 10
        while running.metrics()["specdec_active_generations"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        running.stop()  # what SIGTERM does: stop accepting, let in-flight requests finish
        reply = pending.result(timeout=30)
    assert reply.usage.completion_tokens == 40
    assert not running.app.state.scheduler.thread.is_alive()


def test_specdec_serve_answers_and_exits_cleanly_on_sigterm(tiny_dirs, tmp_path):  # on a two-byte KV cache
    port = bind_socket("127.0.0.1", 0).getsockname()[1]  # a free port (closed again when collected)
    env = dict(os.environ)  # its own SPECDEC_HOME (conftest), the compiled kernels shared
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec.cli", "serve", "--target", str(tiny_dirs["llama"]), "--port", str(port),
         "--drafter", "ngram", "--model-name", "tiny", "--kv-dtype", "float16", "--threads", "1",
         "--reasoning-format", "deepseek"], stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        line = process.stderr.readline()
        assert "serving 'tiny'" in line, line
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0)
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert reply.usage.completion_tokens == 5
        stream = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == reply.choices[0].text
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        process.kill()
        process.wait()


def test_specdec_serve_on_a_taken_port_is_one_line_error(tiny_dirs, capsys):
    from specdec.cli import main

    taken = bind_socket("127.0.0.1", 0)
    taken.listen()
    port = taken.getsockname()[1]
    assert main(["serve", "--target", str(tiny_dirs["llama"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec: error: cannot listen on 127.0.0.1:") and "\n" not in err
    taken.close()


def test_draft_model_drafter_keeps_one_cache_per_interleaved_request(tiny_dirs, tiny_generator):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_HOME", str(tiny_dirs["llama"].parent / "home-draft"))
        drafted = SpeculativeGenerator.from_pretrained(str(tiny_dirs["llama"]), drafter=f"draft:{tiny_dirs['qwen2']}",
                                                       k=3)
    running = RunningServer(drafted, max_active=4)
    try:
        prompts = [f"draft {i} {'xy' * i}" for i in range(6)]
        expected = [tiny_generator.generate(p, 25, chat=False).text for p in prompts]
        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda p: running.client.completions.create(
                model="tiny", prompt=p, max_tokens=25, temperature=0), prompts))
        assert [r.choices[0].text for r in replies] == expected
        assert all(r.model_extra["specdec"]["drafter"].startswith("draft:") for r in replies)
        assert sum(r.model_extra["specdec"]["drafted"] for r in replies) > 0
    finally:
        running.stop()


@pytest.mark.parametrize("window", ["context=2", "context=2,start=1"])  # start=N: a one-token first prefill
def test_lookup_with_a_windowed_draft_model_serves_plain_decodings_text_streamed_and_whole(tiny_dirs, tiny_generator,
                                                                                          window):
    """The default's shape (lookup + a draft model reading a window of the context) behind the server: a
    completion streamed and whole returns plain decoding's text."""
    target = str(tiny_dirs["llama"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_HOME", str(tiny_dirs["llama"].parent / "home-window"))
        windowed = SpeculativeGenerator.from_pretrained(target, drafter=f"ngram+draft:{target}@{window}", k="auto")
    running = RunningServer(windowed)
    try:
        prompt = "the cat sat on the mat, the cat sat on the"
        expected = SpeculativeGenerator(tiny_generator.target, None).generate(prompt, 30, chat=False).text
        kwargs = dict(model="tiny", prompt=prompt, max_tokens=30, temperature=0)
        whole = running.client.completions.create(**kwargs)
        parts = list(running.client.completions.create(stream=True, **kwargs))
        assert whole.choices[0].text == expected == "".join(p.choices[0].text for p in parts)
        assert whole.model_extra["specdec"]["drafter"].startswith("ngram+draft:")
        assert whole.model_extra["specdec"]["drafted"] > 0
    finally:
        running.stop()


def raw_request(port: int, method: str, path: str, body: bytes | str = b"", headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read().decode()


def test_api_key_hosts_content_type_size_and_cors(tiny_generator):
    """Issue 25 items 4, 8, 10, 11: what a hostile client or a web page the user visits can no longer do."""
    running = RunningServer(tiny_generator, api_key="s3cret", max_request_bytes=2000,
                            allowed_hosts=("localhost", "127.0.0.1", "::1"), allowed_origins=("http://app.example",))
    body = json.dumps({"prompt": "a", "max_tokens": 2})
    good = {"Content-Type": "application/json", "Authorization": "Bearer s3cret"}
    try:
        anthropic = {"Content-Type": "application/json", "x-api-key": "s3cret"}  # how Anthropic's clients send it
        for headers in ({"Content-Type": "application/json"}, {**good, "Authorization": "Bearer wrong"},
                        {**good, "Authorization": "s3cret"}, {**anthropic, "x-api-key": "wrong"}):
            status, reply_headers, text = raw_request(running.port, "POST", "/v1/completions", body, headers)
            assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key", headers
        assert raw_request(running.port, "POST", "/v1/completions", body, good)[0] == 200
        assert raw_request(running.port, "POST", "/v1/completions", body, anthropic)[0] == 200
        assert raw_request(running.port, "GET", "/health")[0] == 200  # probes need no key
        # a cross-origin form POST (no preflight in a browser) is refused whatever it carries
        for media_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, _, text = raw_request(running.port, "POST", "/v1/completions", body,
                                          {**good, "Content-Type": media_type})
            assert status == 415, media_type
        # DNS rebinding: a page's own host name resolving to 127.0.0.1
        assert raw_request(running.port, "GET", "/v1/models", headers={**good, "Host": "evil.example"})[0] == 400
        assert raw_request(running.port, "GET", "/v1/models", headers={**good, "Host": "localhost:8000"})[0] == 200
        # 413 before the body is parsed, with or without Content-Length
        status, _, _ = raw_request(running.port, "POST", "/v1/completions", json.dumps({"prompt": "x" * 5000}), good)
        assert status == 413
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
        connection.putrequest("POST", "/v1/completions")
        for name, value in {**good, "Transfer-Encoding": "chunked"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        chunk = json.dumps({"prompt": "x" * 5000}).encode()
        connection.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
        assert connection.getresponse().status == 413
        # CORS: an allowed origin's preflight is answered, another's is not
        preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"}
        status, headers, _ = raw_request(running.port, "OPTIONS", "/v1/completions", headers=preflight)
        assert status == 200 and headers.get("access-control-allow-origin") == "http://app.example"
        status, headers, _ = raw_request(running.port, "OPTIONS", "/v1/completions",
                                         headers={**preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in {k.lower() for k in headers}
        # 405 names the allowed methods
        status, headers, _ = raw_request(running.port, "GET", "/v1/completions", headers=good)
        assert status == 405 and "POST" in {k.lower(): v for k, v in headers.items()}["allow"]
    finally:
        running.stop()


def test_metrics_label_sets_stay_bounded(server):
    for index in range(40):
        server.request("GET", f"/random/path/{index}")
    status, text = server.request("GET", "/metrics")
    endpoints = {s.labels["endpoint"] for f in text_string_to_metric_families(text) for s in f.samples
                 if "endpoint" in s.labels}
    assert not any(e.startswith("/random") for e in endpoints) and "other" in endpoints


def test_openapi_document_describes_bodies_and_errors(server):
    status, text = server.request("GET", "/openapi.json")
    document = json.loads(text)
    for path in ("/v1/chat/completions", "/v1/completions"):
        post = document["paths"][path]["post"]
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        assert {"messages"} <= set(schema["required"]) if "chat" in path else {"prompt"} <= set(schema["required"])
        assert {"400", "401", "413", "415", "503"} <= set(post["responses"])
        assert "$ref" not in json.dumps(schema)  # self-contained: generic tools can drive the API
    metrics_content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "application/json" not in metrics_content and any(k.startswith("text/plain") for k in metrics_content)


def test_a_client_gone_before_its_reply_is_counted_as_499_not_503(tiny_generator):
    running = slow_server(tiny_generator, max_active=1, max_queue=4)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "abc", "max_tokens": 400, "temperature": 0}),
                           headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 10
        while running.metrics()["specdec_active_generations"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        connection.close()
        deadline = time.monotonic() + 10
        while True:
            status, text = running.request("GET", "/metrics")
            statuses = {s.labels.get("status") for f in text_string_to_metric_families(text) for s in f.samples
                        if s.labels.get("endpoint") == "/v1/completions"}
            if "499" in statuses:
                break
            assert time.monotonic() < deadline, statuses
            time.sleep(0.05)
        assert "503" not in statuses
    finally:
        running.stop()


def test_when_the_grace_period_runs_out_replies_end_as_documented(tiny_generator):
    """Issue 25 item 5: a stream still running gets an in-band error and [DONE], a queued request a JSON 503
    (they used to be cut mid-chunk and get a plain-text 500)."""
    running = slow_server(tiny_generator, pause=0.02, grace=0.5, max_active=1, max_queue=4)
    stream = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
    # greedy: a sampled stream may meet EOS before the grace period ends
    body = {"prompt": "abc", "max_tokens": 500, "temperature": 0, "stream": True}
    stream.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = stream.getresponse()
    assert response.status == 200 and response.read(6) == b"data: "
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(raw_request, running.port, "POST", "/v1/completions",
                             json.dumps({"prompt": "a", "max_tokens": 5}), {"Content-Type": "application/json"})
        deadline = time.monotonic() + 10
        while running.metrics()["specdec_queue_length"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        stopping = time.monotonic()
        running.stop()
        assert time.monotonic() - stopping < 0.5 + 2.0  # within the grace period, with room for a slow machine
        status, headers, text = queued.result(timeout=30)
    assert status == 503 and json.loads(text)["error"]["type"] == "server_error"
    rest = response.read().decode()
    events = [line.removeprefix("data: ") for line in rest.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]


def test_prompts_are_tokenized_off_the_worker_and_capped(tiny_generator):
    """Issue 25 item 4: a prompt is tokenized on the request's side, not on the worker thread that runs every
    generation, and --max-prompt-tokens refuses a long one with a 400 before it reaches the worker."""
    running = RunningServer(tiny_generator, max_prompt_tokens=50, max_request_bytes=4 << 20)
    scheduler = running.app.state.scheduler
    threads = []
    encode = scheduler.encode

    def recording(job):
        threads.append(threading.current_thread())
        return encode(job)

    scheduler.encode = recording
    try:
        status, _, text = raw_request(running.port, "POST", "/v1/completions",
                                      json.dumps({"prompt": "word " * 200_000, "max_tokens": 2}),
                                      {"Content-Type": "application/json"})
        assert status == 400 and json.loads(text)["error"]["code"] == "context_length_exceeded"
        reply = running.client.completions.create(model="tiny", prompt="abc", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        assert threads and scheduler.thread not in threads
    finally:
        running.stop()
