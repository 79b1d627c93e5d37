"""Anthropic's Messages API driven by the `anthropic` SDK as its users call it (messages.create, messages.stream,
a tool_use round trip, count_tokens) against a real `specdec serve` on the tiny code model: the answers equal
what the same request gives through chat completions, whole and streamed; errors take Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import pytest

from test_server_api import MESSAGES, WEATHER, coder  # noqa: F401 (coder: the fixture)

anthropic = pytest.importorskip("anthropic")

GREEDY = {"temperature": 0}  # today's SDK has no sampling arguments: the server still reads them
TEXT = [{"role": "user", "content": "abc abc abc"}]  # the tiny model answers it in many printable pieces
TOOL = {"name": WEATHER["function"]["name"], "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}


@pytest.fixture(scope="module")
def client(coder):  # noqa: F811
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{coder.port}", api_key="unused", max_retries=0)


def chat_text(coder, **fields) -> tuple[str, str]:  # noqa: F811
    reply = coder.client.chat.completions.create(model="tiny", messages=TEXT, temperature=0, **fields)
    return reply.choices[0].message.content, reply.choices[0].finish_reason


def test_a_message_whole_and_streamed_equals_chat_completions(coder, client):  # noqa: F811
    text, finish = chat_text(coder, max_tokens=16)
    message = client.messages.create(model="tiny", max_tokens=16, messages=TEXT, extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant"
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == text
    assert message.stop_reason == ("max_tokens" if finish == "length" else "end_turn")
    assert message.usage.output_tokens == 16 and message.usage.input_tokens > 0
    with client.messages.stream(model="tiny", max_tokens=16, messages=TEXT, extra_body=GREEDY) as stream:
        pieces = [piece for piece in stream.text_stream]
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == text
    assert final.content[0].text == text and final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == 16


def test_system_blocks_and_a_stop_sequence(coder, client):  # noqa: F811
    text, _ = chat_text(coder, max_tokens=24)
    stop = text[6:9]
    assert stop.strip(), "the tiny model's answer gives a stop sequence to look for"
    message = client.messages.create(model="tiny", max_tokens=24, messages=TEXT, extra_body=GREEDY,
                                     stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == text[:text.index(stop)]
    with_system = client.messages.create(model="tiny", max_tokens=8, messages=TEXT, extra_body=GREEDY,
                                         system=[{"type": "text", "text": "You are terse."}])
    reply = coder.client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "You are terse."}] + TEXT, max_tokens=8,
        temperature=0)
    assert with_system.content[0].text == reply.choices[0].message.content
    # a system turn mid-conversation, as Claude Code sends one
    turns = TEXT + [{"role": "assistant", "content": "abc"}, {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "abc abc"}]
    midway = client.messages.create(model="tiny", max_tokens=8, messages=turns, extra_body=GREEDY)
    assert midway.content[0].text == coder.client.chat.completions.create(
        model="tiny", messages=turns, max_tokens=8, temperature=0).choices[0].message.content


def test_a_tool_use_round_trip_whole_and_streamed(coder, client):  # noqa: F811
    forced = dict(model="tiny", max_tokens=512, messages=MESSAGES, tools=[TOOL], extra_body=GREEDY,
                  tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    message = client.messages.create(**forced)
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    assert call.input["city"] in ("Paris", "Oslo") and 1 <= call.input["days"] <= 7
    chat = coder.client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], parallel_tool_calls=False, max_tokens=512, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert json.loads(chat.choices[0].message.tool_calls[0].function.arguments) == call.input
    with client.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[-1].input == call.input
    history = MESSAGES + [{"role": "assistant", "content": [block.model_dump() for block in message.content]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                        "content": "18C, sunny"}]}]
    final = client.messages.create(model="tiny", max_tokens=8, messages=history, tools=[TOOL], extra_body=GREEDY,
                                   tool_choice={"type": "none"})
    assert final.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in final.content)


def test_count_tokens_is_the_prompt_a_message_reports(client):
    """As Anthropic counts: a message's input is its input_tokens plus what it read from the prefix cache."""
    def prompt(usage):
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    counted = client.messages.count_tokens(model="tiny", messages=MESSAGES, tools=[TOOL])
    message = client.messages.create(model="tiny", max_tokens=1, messages=MESSAGES, tools=[TOOL])
    bare = client.messages.count_tokens(model="tiny", messages=MESSAGES)
    assert counted.input_tokens == prompt(message.usage) > bare.input_tokens  # the tools are listed
    again = client.messages.create(model="tiny", max_tokens=1, messages=MESSAGES, tools=[TOOL])
    assert prompt(again.usage) == counted.input_tokens and again.usage.cache_read_input_tokens > 0  # a cache hit
    assert bare.input_tokens == prompt(client.messages.create(model="tiny", max_tokens=1, messages=MESSAGES).usage)


@pytest.mark.parametrize("body, status, kind, words", [
    ({"model": "tiny", "messages": MESSAGES}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
     400, "invalid_request_error", "'image' blocks are not supported"),
    ({"model": "other", "max_tokens": 4, "messages": MESSAGES}, 404, "not_found_error", "not served here"),
    ({"model": "tiny", "max_tokens": 4, "messages": MESSAGES, "tool_choice": {"type": "tool"}, "tools": [TOOL]},
     400, "invalid_request_error", "names the tool"),
])
def test_errors_take_anthropics_shape(coder, body, status, kind, words):  # noqa: F811
    reply = httpx.post(f"http://127.0.0.1:{coder.port}/v1/messages", json=body)
    error = reply.json()
    assert reply.status_code == status and error["type"] == "error"
    assert error["error"]["type"] == kind and words in error["error"]["message"]


def test_the_sdk_raises_its_own_error_types(client):
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=MESSAGES)
    with pytest.raises(anthropic.NotFoundError):
        client.get("/v1/messages/nothing", cast_to=object)


def test_output_config_format_constrains_the_answer_to_its_schema(client):
    import jsonschema
    from test_server_api import SCHEMA

    message = client.messages.create(model="tiny", max_tokens=64, messages=MESSAGES, extra_body=GREEDY,
                                     output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    jsonschema.validate(json.loads(message.content[0].text), SCHEMA)


def test_an_assistant_prefill_is_continued_not_answered_as_a_new_turn(coder, client):  # noqa: F811
    """Issue 94: a last message from the assistant is the answer begun by the client: the model continues it
    (its prompt ends inside that message, no new turn opened), as chat's continue_final_message does."""
    from specdec.api.request import GenerationRequest

    prefill = [{"role": "user", "content": "Count to ten."}, {"role": "assistant", "content": "1, 2, 3, 4,"}]
    ids = coder.generator.encode(prefill, continue_final=True)
    rendered = coder.generator.target.tokenizer.decode(ids)
    assert rendered.rstrip().endswith("1, 2, 3, 4,") and ids != coder.generator.encode(prefill)
    expected = coder.generator.run(GenerationRequest(prefill, 12, continue_final=True)).text
    message = client.messages.create(model="tiny", max_tokens=12, messages=prefill, extra_body=GREEDY)
    assert message.content[0].text == expected
    reply = coder.client.chat.completions.create(model="tiny", messages=prefill, max_tokens=12, temperature=0,
                                                 extra_body={"continue_final_message": True})
    assert reply.choices[0].message.content == expected
    assert client.messages.count_tokens(model="tiny", messages=prefill).input_tokens == len(ids)
