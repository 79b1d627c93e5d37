"""Client libraries nobody here wrote, driving a real `specdec serve` over loopback as their users call them:
instructor (JSON_SCHEMA and TOOLS modes with a nested pydantic model), langchain-openai (with_structured_output,
bind_tools, streaming) and litellm (completion with api_base). A tiny code model with a Hermes tool template;
its fields are bounded so that a random-weight model ends them soon."""

from __future__ import annotations

import os

import pytest

from test_server_api import Place, Trip, coder  # noqa: F401 (coder: the fixture)

instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list at import
litellm = pytest.importorskip("litellm")

QUESTION = [{"role": "user", "content": "the weather the weather in Paris"}]


def base_url(server) -> str:
    return f"http://127.0.0.1:{server.port}/v1"


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_returns_the_nested_model(coder, mode):  # noqa: F811
    client = instructor.from_openai(coder.client, mode=getattr(instructor.Mode, mode))
    trip = client.chat.completions.create(model="tiny", messages=QUESTION, response_model=Trip, max_retries=0,
                                          max_tokens=1500, temperature=0)
    assert isinstance(trip, Trip) and isinstance(trip.start, Place)


def test_langchain_structured_output_tools_and_streaming(coder):  # noqa: F811
    chat = langchain_openai.ChatOpenAI(model="tiny", base_url=base_url(coder), api_key="unused", temperature=0,
                                       max_tokens=1500, max_retries=0)
    trip = chat.with_structured_output(Trip).invoke("Plan a trip from Paris.")
    assert isinstance(trip, Trip)
    with_tools = chat.bind_tools([Trip], tool_choice="Trip")
    message = with_tools.invoke("Plan a trip from Paris.")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Trip"
    Trip.model_validate(message.tool_calls[0]["args"])
    short = langchain_openai.ChatOpenAI(model="tiny", base_url=base_url(coder), api_key="unused", temperature=0,
                                        max_tokens=12, max_retries=0)
    pieces = [chunk.content for chunk in short.stream("hello")]
    assert len(pieces) > 1 and "".join(pieces) == short.invoke("hello").content


def test_litellm_completion_whole_and_streamed(coder):  # noqa: F811
    ask = dict(model="openai/tiny", api_base=base_url(coder), api_key="unused", messages=QUESTION, max_tokens=12,
               temperature=0)
    whole = litellm.completion(**ask)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens == 12
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(**ask, stream=True))
    assert streamed == text
