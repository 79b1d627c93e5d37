"""The requests agents and editors send, through the `openai` client as they send them: structured outputs,
tool calls (streamed, and the round trip with a tool's result), logprobs, n choices, fill-in-the-middle
(`suffix`) and llama.cpp's `/infill`. A tiny code model: FIM tokens and a Hermes-style tool template."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from specdec.api.generator import SpeculativeGenerator
from specdec.drafters.ngram import NgramDrafter
from specdec.models.sources.loading import load_model
from test_server import RunningServer
from tiny_models import CODER_VOCAB, make_coder_tokenizer, save_tiny_model

MESSAGES = [{"role": "user", "content": "the weather the weather in Paris"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False,
                   "x-guidance": {"whitespace_flexible": False}}}}
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer",
          "minimum": 0, "maximum": 9}}, "required": ["answer", "score"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}



class Place(BaseModel):
    """Bounded fields and no others: a random-weight model ends them soon."""

    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=7)


class Trip(BaseModel):
    """A trip: where it starts and up to two stops (a nested model: its schema has $defs)."""

    model_config = ConfigDict(extra="forbid")
    start: Place
    stops: list[Place] = Field(max_length=2)


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("coder") / "tiny-coder", "qwen2", seed=3,
                           tokenizer=make_coder_tokenizer(), vocab_size=CODER_VOCAB, max_position_embeddings=2048)
    target = load_model(str(path))
    running = RunningServer(SpeculativeGenerator(target, NgramDrafter(), 4))
    yield running
    running.stop()


def test_json_schema_outputs_match_their_schema(coder):
    import jsonschema

    for body in [{"response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA,
                                                                            "strict": True}}},
                 {"extra_body": {"json_schema": SCHEMA}}]:  # llama-server's field
        reply = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=64, temperature=0,
                                                     **body)
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    reply = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=0,
                                                 response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "length" or isinstance(json.loads(reply.choices[0].message.content), dict)


def test_a_required_tool_call_streams_and_the_round_trip_completes(coder):
    stream = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER],
                                                  tool_choice="required", parallel_tool_calls=False, max_tokens=512,
                                                  temperature=0, stream=True)
    calls, content, finish = {}, "", None
    for chunk in stream:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            calls[call.index] = call
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0] and content.strip() == ""
    call = calls[0]
    assert call.function.name == "get_weather" and call.id and call.type == "function"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in ("Paris", "Oslo") and 1 <= arguments["days"] <= 7
    # the same call, not streamed
    whole = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER],
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                 parallel_tool_calls=False, max_tokens=512, temperature=0)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "get_weather"
    assert json.loads(message.tool_calls[0].function.arguments) == arguments
    # the tool's result goes back; the model answers in text
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [message.tool_calls[0].model_dump()]},
                          {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18C, sunny"}]
    final = coder.client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                                 max_tokens=8, temperature=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason in ("stop", "length")


def test_logprobs_are_the_same_with_and_without_speculation(coder):
    def ask(enabled: bool):
        return coder.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0.8,
                                                    seed=5, logprobs=True, top_logprobs=3,
                                                    extra_body={"speculative": {"enabled": enabled}})
    on, off = ask(True), ask(False)
    assert on.choices[0].message.content == off.choices[0].message.content
    entries_on, entries_off = on.choices[0].logprobs.content, off.choices[0].logprobs.content
    assert [e.logprob for e in entries_on] == [e.logprob for e in entries_off] and len(entries_on) == 24
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries_on)
    legacy = coder.client.completions.create(model="tiny", prompt="the weather", max_tokens=6, temperature=0, logprobs=2)
    columns = legacy.choices[0].logprobs
    assert len(columns.tokens) == len(columns.token_logprobs) == 6 and all(len(top) <= 2 for top in columns.top_logprobs)
    assert "".join(columns.tokens) == legacy.choices[0].text


def test_n_choices_are_the_seeded_generations_of_seed_plus_i(coder):
    several = coder.client.completions.create(model="tiny", prompt="the weather in", max_tokens=12, temperature=0.9,
                                              seed=40, n=3)
    assert [choice.index for choice in several.choices] == [0, 1, 2]
    for i, choice in enumerate(several.choices):
        alone = coder.client.completions.create(model="tiny", prompt="the weather in", max_tokens=12, temperature=0.9,
                                                seed=40 + i)
        assert choice.text == alone.choices[0].text
    streamed = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.9,
                                                    seed=40, n=2, stream=True)
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    for i, text in enumerate(texts):
        alone = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.9,
                                                     seed=40 + i)
        assert text == alone.choices[0].message.content


def test_fill_in_the_middle_through_suffix_and_infill(coder):
    generator = coder.generator
    prompt = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>"
    expected = generator.generate(prompt, 16, chat=False).text
    reply = coder.client.completions.create(model="tiny", prompt="def add(a, b):\n    ", suffix="\n    return c",
                                            max_tokens=16, temperature=0)
    assert reply.choices[0].text == expected
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n    return c", "n_predict": 16,
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]}
    status, text = coder.request("POST", "/infill", json.dumps(body))
    answer = json.loads(text)
    assert status == 200 and answer["stop"] is True and answer["tokens_predicted"] >= 1
    with_files = ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef sub(a, b):\n    return a - b\n<|file_sep|>\n"
                  "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>")
    assert answer["content"] == generator.generate(with_files, 16, chat=False).text
    status, text = coder.request("POST", "/infill", json.dumps({**body, "stream": True}))
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: ")]
    assert status == 200 and events[-1]["stop"] and "".join(e["content"] for e in events) == answer["content"]


def test_streamed_logprobs_equal_the_whole_replys(coder):
    """Issue 52: the server's round loop carried no logprobs in its chunks."""
    ask = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=0.8, seed=7, logprobs=True, top_logprobs=2)
    whole = coder.client.chat.completions.create(**ask).choices[0].logprobs.content
    streamed = [entry for chunk in coder.client.chat.completions.create(**ask, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole] and len(whole) == 16
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_tool_parameters_with_defs_from_nested_pydantic_models(coder):
    """Issue 52: a required or named tool call whose parameters use $defs (what pydantic writes for nested
    models, and instructor's TOOLS mode sends) was refused ("Pointer '/$defs/Loc' does not exist")."""
    import jsonschema

    parameters = {**Trip.model_json_schema(), "x-guidance": {"whitespace_flexible": False}}
    assert "$defs" in parameters
    tools = [{"type": "function", "function": {"name": "plan_trip", "parameters": parameters}}, WEATHER]
    for choice in ("required", {"type": "function", "function": {"name": "plan_trip"}}):
        reply = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools, tool_choice=choice,
                                                     parallel_tool_calls=False, max_tokens=400, temperature=0)
        calls = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1, reply
        schema = parameters if calls[0].function.name == "plan_trip" else WEATHER["function"]["parameters"]
        jsonschema.validate(json.loads(calls[0].function.arguments), schema)


ARITHMETIC = '''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9] | "(" expr ")"
'''


def test_gbnf_grammars_constrain_whole_and_streamed_replies(coder):
    """Issue 52: every GBNF grammar was refused ('module' object is not callable); a valid one now masks the
    output, the same whole and streamed."""
    import re

    for grammar, pattern in [('root ::= "yes" | "no"', r"(yes|no)"), (ARITHMETIC, r"[0-9+\-()]+")]:
        ask = dict(model="tiny", prompt="1+2=", max_tokens=12, temperature=0.9, seed=3, extra_body={"grammar": grammar})
        whole = coder.client.completions.create(**ask).choices[0]
        streamed = "".join(chunk.choices[0].text for chunk in coder.client.completions.create(**ask, stream=True)
                           if chunk.choices)
        assert re.fullmatch(pattern, whole.text), whole.text
        assert streamed == whole.text
        if whole.finish_reason == "stop":  # the grammar's end: a complete sentence of it
            assert grammar != ARITHMETIC or whole.text.count("(") == whole.text.count(")")


def test_auto_tool_choice_allows_text_or_well_formed_calls_never_bare_json(coder):
    """Issue 52: under tool_choice "auto" small models answered with bare JSON or a fenced JSON block, which no
    client reads as a call; the auto grammar allows text (not opening as JSON) or calls in the template's
    format whose arguments match their schema. --no-tool-grammar leaves the answer unconstrained."""
    import jsonschema

    from specdec.api.structured import GrammarConstraint
    from specdec.server.protocol import ChatCompletionRequest

    tokenizer = coder.generator.target.tokenizer
    body = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "auto"})
    grammar = body.generation_request(64, tokenizer).grammar
    assert body.generation_request(64, tokenizer, tool_grammar=False).grammar is None
    for text, allowed in [("It is sunny.", True), ("```python\nx = 1", True), (' {"name": "get_weather"}', False),
                          ("```json\n{", False), ("```\n{", False),
                          ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
                           '</tool_call>', True),
                          ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"', False)]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        constraint = GrammarConstraint(grammar, tokenizer, coder.generator.target.model.vocab_size)
        assert (constraint.allowed_prefix(ids) == len(ids)) == allowed, text
    for seed in range(4):
        reply = coder.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=200,
                                                     temperature=1.0, seed=seed)
        message = reply.choices[0].message
        assert not (message.content or "").lstrip().startswith(("{", "```json"))
        for call in message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_llama_servers_own_routes_answer_as_llama_server_does(coder):
    """Issue 72 item 5: /completion (text or ids, whole and streamed, timings with the draft counts),
    /tokenize (with pieces), /detokenize, /apply-template and /props, each answered as llama-server
    answers; the completion's text equals the OpenAI route's (greedy)."""
    tokenizer = coder.generator.target.tokenizer
    status, text = coder.request("POST", "/tokenize", json.dumps({"content": "def add(a, b):", "with_pieces": True}))
    pieces = json.loads(text)["tokens"]
    assert status == 200 and "".join(p["piece"] for p in pieces) == "def add(a, b):"
    ids = [p["id"] for p in pieces]
    status, text = coder.request("POST", "/tokenize", json.dumps({"content": "def add(a, b):"}))
    assert json.loads(text)["tokens"] == ids == tokenizer.encode("def add(a, b):", add_special_tokens=False)
    status, text = coder.request("POST", "/detokenize", json.dumps({"tokens": ids}))
    assert status == 200 and json.loads(text)["content"] == "def add(a, b):"
    status, text = coder.request("POST", "/apply-template", json.dumps({"messages": MESSAGES}))
    assert status == 200 and json.loads(text)["prompt"] == tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False)
    status, text = coder.request("POST", "/apply-template", json.dumps({"messages": MESSAGES, "tools": [WEATHER]}))
    assert status == 200 and json.loads(text)["prompt"] == tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False, tools=[WEATHER]) and "get_weather" in text  # issue 90
    status, text = coder.request("GET", "/props")
    props = json.loads(text)
    assert status == 200 and props["default_generation_settings"]["n_ctx"] == 2048 and props["chat_template"]

    openai_text = coder.client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=24,
                                                  temperature=0).choices[0].text
    for prompt in ("def add(a, b):", tokenizer.encode("def add(a, b):")):
        status, text = coder.request("POST", "/completion", json.dumps({"prompt": prompt, "n_predict": 24}))
        reply = json.loads(text)
        assert status == 200 and reply["stop"] is True and reply["content"] == openai_text
        assert reply["timings"]["predicted_n"] == reply["tokens_predicted"] == 24
        assert reply["timings"]["draft_n"] >= reply["timings"]["draft_n_accepted"] >= 0
    status, text = coder.request("POST", "/completion", json.dumps({"prompt": "def add(a, b):", "n_predict": 24,
                                                                    "stream": True}))
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == openai_text
    for path, body in (("/detokenize", {"tokens": [10**9]}), ("/tokenize", {"content": 5}),
                       ("/completion", {"prompt": ""}), ("/completion", {"prompt": "a", "n_predict": -2}),
                       ("/apply-template", {"messages": []}), ("/completion", {"prompt": [10**9]})):
        status, text = coder.request("POST", path, json.dumps(body))
        assert status == 400 and "error" in json.loads(text), (path, body, text)


def test_llama_servers_completion_honours_grammars_n_probs_n_predict_0_and_model(coder):
    """Issue 94: /completion and /infill apply `grammar` and `json_schema` (exactly, as chat's response_format)
    and return `n_probs` alternatives as llama-server's `completion_probabilities`, whole and streamed;
    n_predict 0 reads the prompt and generates nothing; `model` picks the served model."""
    import jsonschema

    for body in ({"grammar": 'root ::= "yes" | "no"'}, {"json_schema": SCHEMA}):
        status, text = coder.request("POST", "/completion", json.dumps({"prompt": "Answer:", "n_predict": 64, **body}))
        content = json.loads(text)["content"]
        assert status == 200, text
        if "grammar" in body:
            assert content in ("yes", "no")
        else:
            jsonschema.validate(json.loads(content), SCHEMA)
    status, text = coder.request("POST", "/infill", json.dumps({"input_prefix": "x = ", "input_suffix": "\n",
                                                                "n_predict": 8, "grammar": 'root ::= [0-9]+'}))
    assert status == 200 and json.loads(text)["content"].isdigit(), text
    ask = {"prompt": "def add(a, b):", "n_predict": 6, "n_probs": 3}
    status, text = coder.request("POST", "/completion", json.dumps(ask))
    probabilities = json.loads(text)["completion_probabilities"]
    assert status == 200 and len(probabilities) == 6 and all(len(p["top_logprobs"]) == 3 for p in probabilities)
    assert all(p["id"] == p["top_logprobs"][0]["id"] for p in probabilities)  # greedy: the likeliest each time
    status, text = coder.request("POST", "/completion", json.dumps({**ask, "stream": True}))
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert [p for e in events for p in e.get("completion_probabilities", [])] == probabilities
    for stream in (False, True):
        status, text = coder.request("POST", "/completion", json.dumps({"prompt": "hi", "n_predict": 0,
                                                                        "stream": stream}))
        reply = json.loads(text.removeprefix("data: ").strip())
        assert status == 200 and reply["content"] == "" and reply["tokens_predicted"] == 0 and reply["stop"]
    status, text = coder.request("POST", "/completion", json.dumps({"prompt": "hi", "model": "nope"}))
    assert status == 404 and "nope" in text
    for bad in ({"grammar": "root ::= ("}, {"json_schema": {"type": "nonsense"}}, {"n_probs": 99},
                {"grammar": 'root ::= "a"', "json_schema": SCHEMA}):
        status, text = coder.request("POST", "/completion", json.dumps({"prompt": "hi", **bad}))
        assert status == 400, (bad, text)


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "integer"}, {"type": "array"}, {"type": "null"},
                                    {"type": ["string", "null"]}, {"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}}])
def test_tools_whose_parameters_are_not_an_object_are_refused_on_every_route(coder, schema):
    """Issue 94: both APIs define a call's arguments as an object; a tool whose parameters describe anything
    else is a 400 naming it, in each dialect's shape (it was accepted, and under a required call a 500)."""
    import httpx

    base = f"http://127.0.0.1:{coder.port}"
    function = {"name": "shout", "parameters": schema}
    asks = [("/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 8,
                                      "tools": [{"type": "function", "function": function}], "tool_choice": "required"}),
            ("/v1/messages", {"model": "tiny", "max_tokens": 8, "messages": MESSAGES,
                              "tools": [{"name": "shout", "input_schema": schema}], "tool_choice": {"type": "any"}}),
            ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 8,
                               "tools": [{"type": "function", **function}], "tool_choice": "required"}),
            ("/api/chat", {"model": "tiny", "messages": MESSAGES, "stream": False,
                           "tools": [{"type": "function", "function": function}]})]
    for path, body in asks:
        for stream in (False, True):
            reply = httpx.post(base + path, json={**body, "stream": stream}, timeout=60)
            assert reply.status_code == 400 and "shout" in reply.text and "object" in reply.text, (path, reply.text)
            if path == "/v1/messages":
                assert reply.json()["type"] == "error"


def test_more_tools_than_openai_takes_are_a_400_on_every_route(coder):
    """Issue 94: a request with 300 tools held the worker for minutes compiling their grammar."""
    import httpx

    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    base = f"http://127.0.0.1:{coder.port}"
    for path, body in [("/v1/chat/completions", {"messages": MESSAGES, "tools": many}),
                       ("/v1/messages", {"max_tokens": 4, "messages": MESSAGES,
                                         "tools": [{"name": t["function"]["name"], "input_schema": {"type": "object"}}
                                                   for t in many]}),
                       ("/v1/responses", {"input": "hi", "tools": [{"type": "function", **t["function"]} for t in many]}),
                       ("/api/chat", {"messages": MESSAGES, "tools": many, "stream": False})]:
        reply = httpx.post(base + path, json={"model": "tiny", **body}, timeout=60)
        assert reply.status_code == 400 and "128" in reply.text, (path, reply.text)


def test_a_tool_whose_parameters_leave_the_type_open_is_called_with_an_object(coder):
    """Parameters without a type (an object's keywords alone, or an anyOf that allows a string): the call
    grammar holds the arguments to an object."""
    closed = {"x-guidance": {"whitespace_flexible": False}}  # a random-weight model ends a closed object soon
    for schema in ({"additionalProperties": False, **closed},
                   {"anyOf": [{"properties": {"a": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": False},
                              {"type": "string"}], **closed}):
        reply = coder.client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=256, temperature=0, parallel_tool_calls=False,
            tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}], tool_choice="required")
        calls = reply.choices[0].message.tool_calls
        assert calls and isinstance(json.loads(calls[0].function.arguments), dict), (schema, reply)


def test_timings_per_token_adds_llama_servers_timings_to_chat_replies(coder):
    ask = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"timings_per_token": True})
    reply = coder.client.chat.completions.create(**ask)
    timings, figures = reply.model_extra["timings"], reply.model_extra["specdec"]
    assert timings["predicted_n"] == 12 and timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
    assert timings["draft_n"] == figures["drafted"] and timings["draft_n_accepted"] == figures["accepted"]
    last = list(coder.client.chat.completions.create(**ask, stream=True))[-1].model_extra
    assert last["timings"]["predicted_n"] == 12 and last["timings"]["draft_n"] == last["specdec"]["drafted"]
    plain = coder.client.chat.completions.create(**{**ask, "extra_body": {}}).model_extra
    assert "timings" not in plain


def test_include_speculation_gives_each_tokens_origin_in_the_stream(coder):
    ask = dict(model="tiny", messages=[{"role": "user", "content": "abc abc abc"}], max_tokens=24, temperature=0)
    chunks = list(coder.client.chat.completions.create(**ask, stream=True, stream_options={
        "include_speculation": True, "include_usage": True}))
    rounds = [chunk.model_extra["speculation"] for chunk in chunks if "speculation" in (chunk.model_extra or {})]
    tokens = [token for r in rounds for token in r["tokens"]]
    assert len(tokens) == chunks[-1].usage.completion_tokens == 24
    stats = next(chunk.model_extra["specdec"] for chunk in chunks if "specdec" in (chunk.model_extra or {}))
    assert sum(r["accepted"] for r in rounds) == stats["accepted"] and sum(r["drafted"] for r in rounds) == \
        stats["drafted"]
    assert {token["origin"] for token in tokens} <= {"drafted", "forced", "recovered", "bonus", "target"}
    assert all(r["source"] == "ngram" for r in rounds if r["drafted"])
    text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert text == coder.client.chat.completions.create(**ask).choices[0].message.content
    fit = next(chunk.model_extra["speculation_fit"] for chunk in chunks if "speculation_fit" in (chunk.model_extra or {}))
    assert fit["speedup_by_k"][0] == 1.0 and len(fit["speedup_by_k"]) >= 9 and 0 <= fit["best_k"] <= 8
    assert all(0 <= alpha <= 1 for alpha in fit["alphas"]) and fit["mean_k"] > 0
    # how many rounds judged each position: every drafting round its first, fewer each position after
    assert fit["samples"][0] == sum(r["drafted"] > 0 for r in rounds) and fit["samples"] == sorted(fit["samples"],
                                                                                                   reverse=True)
    plain = list(coder.client.chat.completions.create(**ask, stream=True))
    assert not any("speculation" in (chunk.model_extra or {}) for chunk in plain)
