"""The one request type: validated where it is built, and the same request whichever face built it."""

from __future__ import annotations

import dataclasses

import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import KSetting
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import InvalidParameterError
from specdec.engine import run_alone


@pytest.mark.parametrize("changes, message", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"stop": ("",)}, "stop strings"),
    ({"seed": 10**30}, "seed"),
    ({"k": 0}, "k must be"),
    ({"k": "auto:99"}, "auto:N"),
    ({"k": "often"}, "k must be"),
    ({"prompt": 3}, "prompt"),
])
def test_a_bad_request_is_refused_where_it_is_built(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        GenerationRequest(**{"prompt": "hi", **changes})


def test_a_bare_stop_string_and_a_list_become_a_tuple():
    assert GenerationRequest("hi", stop="END").stop == ("END",)
    assert GenerationRequest("hi", stop=["a", "b"]).stop == ("a", "b")
    assert GenerationRequest([1, 2, 3]).token_ids == [1, 2, 3]
    assert GenerationRequest("hi").token_ids is None


def test_cli_and_server_build_the_same_request(tiny_dirs):
    """The CLI's flags and the server's JSON body for the same settings give equal requests."""
    from specdec.cli import build_parser
    from specdec.cli_options import request_from_args
    from specdec.server.protocol import ChatCompletionRequest, CompletionRequest
    from specdec.server.request_body import parse_request

    args = build_parser().parse_args(["generate", "hello", "--no-chat", "--max-new-tokens", "12", "--temperature",
                                      "0.7", "--top-p", "0.9", "--top-k", "5", "--stop", "END", "--seed", "3"])
    from_cli = request_from_args(args, "hello")
    body = parse_request(b'{"prompt": "hello", "max_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 5, '
                         b'"stop": "END", "seed": 3}', CompletionRequest)
    assert body.generation_request(512) == from_cli
    chat = parse_request(b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7, '
                         b'"speculative": {"k": 3}}', ChatCompletionRequest).generation_request(512)
    assert chat.chat and chat.k == KSetting(3) and chat.max_new_tokens == 7 and chat.sampling == SamplingParams(temperature=1.0)


def test_run_start_and_the_keyword_methods_agree(tiny_dirs):
    from specdec.models.sources.loading import load_model

    target = load_model(str(tiny_dirs["llama"]))
    generator = SpeculativeGenerator(target, NgramDrafter(), 4)
    request = GenerationRequest("the cat the cat the", 20, chat=False)
    expected = generator.generate("the cat the cat the", 20, chat=False).token_ids
    assert generator.run(request).token_ids == expected
    assert generator.run(request.replace(speculative=False)).token_ids == expected  # plain decoding, same text
    assert generator.run(request.replace(k=2)).stats.drafter == generator.engine.drafter_name
    streamed = [token for chunk in run_alone(generator.start(request)) for token in chunk.token_ids]
    assert streamed == expected
    ids = generator.prompt_ids(request)
    assert generator.run(GenerationRequest(ids, 20)).token_ids == expected  # token ids as the prompt
    with pytest.raises(InvalidParameterError, match="token ids"):
        generator.prompt_ids(GenerationRequest([target.model.vocab_size], 4))


def test_every_front_end_builds_sampling_one_way_from_its_fields():
    """SamplingParams.of reads the fields named as SamplingParams's: a command line's namespace, an OpenAI
    body, llama-server's /infill body (its `repeat_penalty` is the field's alias); checks stay the dataclass's."""
    import argparse

    from specdec.errors import InvalidParameterError
    from specdec.server.infill import InfillRequest
    from specdec.server.protocol import CompletionRequest

    args = argparse.Namespace(temperature=0.7, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=4)
    assert SamplingParams.of(args) == SamplingParams(0.7, 3, 0.9, 0.05, 1.1)
    body = CompletionRequest.model_validate({"prompt": "a", "temperature": 0.5, "top_k": 2, "min_p": 0.1})
    assert SamplingParams.of(body) == SamplingParams(0.5, 2, 1.0, 0.1, 1.0)
    infill = InfillRequest.model_validate({"input_prefix": "a", "repeat_penalty": 1.3, "temperature": 0.2})
    assert infill.sampling() == SamplingParams(0.2, 0, 1.0, 0.0, 1.3, repeat_last_n=64)  # llama-server's window
    with pytest.raises(InvalidParameterError):
        SamplingParams.of(argparse.Namespace(temperature=-1.0))
    # the keyword methods: every sampling knob is a request keyword, read the same way
    from specdec.api.request import RequestKeywords

    assert {f.name for f in dataclasses.fields(SamplingParams)} <= set(RequestKeywords.__annotations__)
    request = GenerationRequest.of("a", 8, temperature=0.7, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                   stop="x", seed=4)
    assert request.sampling == SamplingParams(0.7, 3, 0.9, 0.05, 1.1) and request.stop == ("x",)
    with pytest.raises(TypeError, match="temprature"):
        GenerationRequest.of("a", 8, temprature=0.7)
