"""OpenAI's Responses API driven by the `openai` SDK's `responses` calls and by the Agents SDK's Runner on its
default (Responses) model, against a real `specdec serve` on the tiny code model: whole and streamed
outputs equal chat completions' for the same request; a function-tool round trip; a json_schema format;
stored responses continued with previous_response_id, fetched, deleted."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest

from test_server_anthropic import TEXT
from test_server_api import MESSAGES, SCHEMA, WEATHER, coder  # noqa: F401 (coder: the fixture)

FUNCTION = {"type": "function", **WEATHER["function"]}
FORCED = {"type": "function", "name": "get_weather"}


def chat(coder, messages, **fields):  # noqa: F811
    return coder.client.chat.completions.create(model="tiny", messages=messages, temperature=0, **fields)


def test_a_response_whole_and_streamed_equals_chat_completions(coder):  # noqa: F811
    text = chat(coder, TEXT, max_tokens=16).choices[0].message.content
    response = coder.client.responses.create(model="tiny", input=TEXT[0]["content"], max_output_tokens=16,
                                             temperature=0)
    assert response.object == "response" and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == text and response.usage.output_tokens == 16
    kinds, deltas = [], []
    for event in coder.client.responses.create(model="tiny", input=TEXT, max_output_tokens=16, temperature=0,
                                               stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        last = event
    assert len(deltas) > 1 and "".join(deltas) == text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert last.response.output_text == text and [event for event in kinds if event == "error"] == []


def test_instructions_are_the_system_message(coder):  # noqa: F811
    response = coder.client.responses.create(model="tiny", instructions="Be terse.", input=TEXT,
                                             max_output_tokens=8, temperature=0)
    assert response.output_text == chat(coder, [{"role": "system", "content": "Be terse."}] + TEXT,
                                        max_tokens=8).choices[0].message.content


def test_a_function_call_round_trip_whole_and_streamed(coder):  # noqa: F811
    asked = dict(model="tiny", input=MESSAGES, tools=[FUNCTION], tool_choice=FORCED, parallel_tool_calls=False,
                 max_output_tokens=512, temperature=0)
    response = coder.client.responses.create(**asked)
    call = response.output[-1]
    assert response.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    chat_call = chat(coder, MESSAGES, tools=[WEATHER], parallel_tool_calls=False, max_tokens=512,
                     tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0].message
    assert json.loads(call.arguments) == json.loads(chat_call.tool_calls[0].function.arguments)
    events = list(coder.client.responses.create(**asked, stream=True))
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == json.loads(call.arguments)
    assert events[-1].type == "response.completed" and events[-1].response.output[-1].name == "get_weather"
    followed = coder.client.responses.create(
        model="tiny", input=MESSAGES + [call.model_dump(exclude_none=True),
                                        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
        tools=[FUNCTION], tool_choice="none", max_output_tokens=8, temperature=0)
    assert all(item.type == "message" for item in followed.output)


def test_namespace_tools_are_called_by_namespace_and_hosted_tools_left_out(coder):  # noqa: F811
    """As Codex CLI lists its tools: functions inside a namespace, and web_search (OpenAI's own)."""
    tools = [{"type": "namespace", "name": "weather", "description": "Weather tools.",
              "tools": [{**FUNCTION, "name": "today"}]}, {"type": "web_search", "external_web_access": True}]
    response = coder.client.responses.create(model="tiny", input=MESSAGES, tools=tools, tool_choice="required",
                                             parallel_tool_calls=False, max_output_tokens=512, temperature=0)
    call = response.output[-1]
    assert call.type == "function_call" and (call.namespace, call.name) == ("weather", "today")
    chat_call = chat(coder, MESSAGES, tools=[{"type": "function", "function": {**WEATHER["function"],
                                                                                 "name": "weather.today"}}],
                     tool_choice="required", parallel_tool_calls=False, max_tokens=512).choices[0].message
    assert json.loads(call.arguments) == json.loads(chat_call.tool_calls[0].function.arguments)
    again = coder.client.responses.create(  # the call goes back with its namespace, as Codex sends it
        model="tiny", input=MESSAGES + [call.model_dump(exclude_none=True),
                                        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
        tools=tools, tool_choice="none", max_output_tokens=4, temperature=0)
    assert again.status in ("completed", "incomplete")


def test_a_json_schema_format_is_followed(coder):  # noqa: F811
    import jsonschema

    response = coder.client.responses.create(
        model="tiny", input=MESSAGES, max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_previous_response_id_continues_the_stored_conversation(coder):  # noqa: F811
    first = coder.client.responses.create(model="tiny", input=TEXT, max_output_tokens=6, temperature=0)
    second = coder.client.responses.create(model="tiny", input="abc", previous_response_id=first.id,
                                           max_output_tokens=6, temperature=0)
    history = TEXT + [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "abc"}]
    assert second.output_text == chat(coder, history, max_tokens=6).choices[0].message.content
    assert second.previous_response_id == first.id
    assert coder.client.responses.retrieve(first.id).output_text == first.output_text
    coder.client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        coder.client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        coder.client.responses.create(model="tiny", input="x", previous_response_id=first.id, max_output_tokens=2)
    unstored = coder.client.responses.create(model="tiny", input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        coder.client.responses.retrieve(unstored.id)


def test_deleting_a_response_forgets_it_in_every_conversation_that_continues_it(coder):  # noqa: F811
    """Issue 94: a child held its parent's text (the whole conversation), so after DELETE of the parent the
    child's continuation still read it back. Now the child and its descendants go with it."""
    parent = coder.client.responses.create(model="tiny", input="The password is ZEBRA.", max_output_tokens=2)
    child = coder.client.responses.create(model="tiny", input="ok", previous_response_id=parent.id, max_output_tokens=2)
    grandchild = coder.client.responses.create(model="tiny", input="ok", previous_response_id=child.id,
                                               max_output_tokens=2)
    other = coder.client.responses.create(model="tiny", input="unrelated", max_output_tokens=2)
    coder.client.responses.delete(parent.id)
    for gone in (parent.id, child.id, grandchild.id):
        with pytest.raises(openai.NotFoundError):
            coder.client.responses.retrieve(gone)
        with pytest.raises(openai.NotFoundError):
            coder.client.responses.create(model="tiny", input="What is the password?", previous_response_id=gone,
                                          max_output_tokens=2)
    assert coder.client.responses.retrieve(other.id).id == other.id


def test_the_store_is_bounded_in_bytes_and_metadata_in_openais_bounds(coder):  # noqa: F811
    from specdec.server.response_store import ResponseStore

    store = ResponseStore(budget_bytes=1500)  # three of these 470-byte entries
    for index in range(5):
        store.put({"id": f"r{index}", "metadata": {"k": "x" * 400}}, [{"role": "user", "content": "hi"}])
    assert store.bytes <= 1500 and list(store.kept) == ["r2", "r3", "r4"]  # the oldest went first
    store.put({"id": "huge", "metadata": {"k": "x" * 5000}}, [])
    assert "huge" not in store.kept and store.bytes <= 1500
    for metadata in ({f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"}):
        reply = httpx.post(f"http://127.0.0.1:{coder.port}/v1/responses",
                           json={"model": "tiny", "input": "hi", "max_output_tokens": 2, "metadata": metadata})
        assert reply.status_code == 400 and "metadata" in reply.json()["error"]["message"]


@pytest.mark.parametrize("body, words", [
    ({"input": "x", "tools": [{"type": "custom", "name": "patch"}]}, "'custom' tools are not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "'input_image' content parts are not supported"),
    ({"input": "x", "background": True}, "background=true is not supported"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nothing"}, "tools": [FUNCTION]},
     "not among the tools"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference' input items are not supported"),
    *[({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": text}]}]},
       "only text parts") for text in (5, None, ["a"])],  # issue 94: these were 500s
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"}]}]},
     "only text parts"),
])
def test_refusals_are_400s_naming_the_field(coder, body, words):  # noqa: F811
    reply = httpx.post(f"http://127.0.0.1:{coder.port}/v1/responses", json={"model": "tiny", **body})
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]


def test_the_agents_sdk_runs_an_agent_with_a_function_tool(coder):  # noqa: F811
    agents = pytest.importorskip("agents")
    from agents.models.openai_responses import OpenAIResponsesModel

    calls = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:  # bounded: a random-weight model ends it
        """The weather in a city."""
        calls.append(city)
        return "18C, sunny"

    def model():  # a client per event loop (run_sync and asyncio.run each run one)
        return OpenAIResponsesModel(model="tiny", openai_client=openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{coder.port}/v1", api_key="unused", max_retries=0))

    agent = agents.Agent(name="weather", instructions="Answer with the weather.", model=model(), tools=[get_weather],
                         tool_use_behavior="stop_on_first_tool",  # the tool's answer is the agent's
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=256, tool_choice="required",
                                                             parallel_tool_calls=False))
    agents.set_tracing_disabled(True)
    result = agents.Runner.run_sync(agent, "the weather in Paris", max_turns=2)
    assert calls and result.final_output == "18C, sunny"
    agent.model = model()

    async def streamed_run():
        streamed = agents.Runner.run_streamed(agent, "the weather in Paris", max_turns=2)
        kinds = [event.type async for event in streamed.stream_events()]
        return streamed, kinds

    import asyncio
    streamed, kinds = asyncio.run(streamed_run())
    assert "raw_response_event" in kinds
    assert streamed.final_output == "18C, sunny" and len(calls) == 2


def test_a_function_call_output_of_text_parts_is_read(coder):  # noqa: F811
    ask = {"model": "tiny", "max_output_tokens": 4, "input": [
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "18C"}]}]}
    reply = httpx.post(f"http://127.0.0.1:{coder.port}/v1/responses", json=ask, timeout=60)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("tools", [True, 3, 1.5, "x", [3], [{"type": "namespace", "name": "n", "tools": 7}],
                                   [{"type": "namespace", "name": "n", "tools": [5]}]])
def test_tools_of_the_wrong_shape_are_400s(coder, tools):  # noqa: F811
    reply = httpx.post(f"http://127.0.0.1:{coder.port}/v1/responses", json={"input": "x", "tools": tools})
    assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("tools")
