"""The Responses and Anthropic Messages writers on an answer with every part (a reasoning block, text, a tool
call written in the template's markers), fed whole and streamed in several cuts: the streamed events add
up to the whole reply, blocks open and close in order, and the stream's last event names the same ending."""

from __future__ import annotations

import json

import pytest

from specdec.api.reasoning import Reasoning
from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.core.stats import GenerationStats
from specdec.server.anthropic_reply import AnthropicReply
from specdec.server.response_store import ResponseStore
from specdec.server.responses_api import ResponsesRequest
from specdec.server.responses_reply import ResponsesReply

TOOLS = ({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},)
TEXT = '<think>Paris, so call it.</think>Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def result(finish: str = "stop") -> GenerationResult:
    stats = GenerationStats("ngram", 10, 30, 1.0, 0.1, 10, 20, 10, 0.5, [0.5], 2.0, 0.1, 0.8, 0.1, 30.0, 33.0)
    return GenerationResult(TEXT, list(range(30)), finish, stats)


def events(frames: list[str]) -> list[dict]:
    return [json.loads(frame.split("data: ", 1)[1]) for frame in frames]


def stream(reply, cut: int) -> list[dict]:
    frames = reply.stream_start(10)
    for start in range(0, len(TEXT), cut):
        frames += reply.stream_text(0, StreamChunk(TEXT[start:start + cut], [1]))
    return events(frames + reply.stream_done(0, result()) + reply.stream_end([result()], 10))


@pytest.mark.parametrize("cut", [1, 3, 7, len(TEXT)])
def test_anthropic_stream_adds_up_to_the_whole_message(cut):
    def reply():
        return AnthropicReply("tiny", TOOLS, Reasoning(), (), lambda ids: TEXT)

    whole = reply().whole([result()], 10)
    assert [block["type"] for block in whole["content"]] == ["thinking", "text", "tool_use"]
    assert whole["content"][2]["input"] == {"city": "Paris"} and whole["stop_reason"] == "tool_use"
    streamed = stream(reply(), cut)
    assert streamed[0]["type"] == "message_start" and streamed[-1]["type"] == "message_stop"
    blocks: dict[int, dict] = {}
    for event in streamed:
        if event["type"] == "content_block_start":
            assert not blocks or all("stopped" in b for b in blocks.values()), "a block opened before the last closed"
            blocks[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial"}[delta["type"]]
            block[key] = block.get(key, "") + delta[{"partial": "partial_json"}.get(key, key)]
        elif event["type"] == "content_block_stop":
            blocks[event["index"]]["stopped"] = True
    assert [blocks[i]["type"] for i in sorted(blocks)] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == whole["content"][0]["thinking"] and blocks[1]["text"] == whole["content"][1]["text"]
    assert json.loads(blocks[2]["partial"]) == whole["content"][2]["input"]
    assert streamed[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("cut", [1, 3, 7, len(TEXT)])
def test_responses_stream_adds_up_to_the_whole_response(cut):
    body = ResponsesRequest.model_validate({"input": "x", "tools": [{"type": "function", "name": "get_weather"}]})

    def reply():
        return ResponsesReply("tiny", body, TOOLS, Reasoning(), ResponseStore())

    whole = reply().whole([result()], 10)
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message", "function_call"]
    streamed = stream(reply(), cut)
    assert [event["sequence_number"] for event in streamed] == list(range(len(streamed)))
    assert streamed[-1]["type"] == "response.completed"
    final = streamed[-1]["response"]["output"]
    assert [item["type"] for item in final] == ["reasoning", "message", "function_call"]
    assert final[0]["content"] == whole["output"][0]["content"] and final[1]["content"] == whole["output"][1]["content"]
    texts = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    thoughts = "".join(e["delta"] for e in streamed if e["type"] == "response.reasoning_text.delta")
    assert (thoughts, texts) == (whole["output"][0]["content"][0]["text"], whole["output"][1]["content"][0]["text"])
    done = [e for e in streamed if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [{"city": "Paris"}]
