"""Every field each API dialect's request bodies declare is named in that dialect's section of docs/server.md
(issue 94: a field a route accepts, honours or refuses is one a user can look up). A field added to a body
without a line in the docs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.server.anthropic_messages import MessagesRequest
from specdec.server.infill import InfillRequest
from specdec.server.llama_server import ApplyTemplateBody, CompletionBody, DetokenizeBody, TokenizeBody
from specdec.server.ollama.bodies import ChatBody, GenerateBody, OllamaOptions
from specdec.server.protocol import NEUTRAL_ONLY, ChatCompletionRequest, CompletionRequest
from specdec.server.responses_api import NEUTRAL_ONLY as RESPONSES_NEUTRAL_ONLY
from specdec.server.responses_api import ResponsesRequest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "server.md"
# a dialect's docs section -> its request bodies (pydantic models) and the fields it takes at neutral values only
SECTIONS = {
    "## Request fields": ([ChatCompletionRequest, CompletionRequest], NEUTRAL_ONLY),
    "## OpenAI Responses API": ([ResponsesRequest], RESPONSES_NEUTRAL_ONLY),
    "## Anthropic Messages API": ([MessagesRequest], {}),
    "## Ollama's API": ([ChatBody, GenerateBody, OllamaOptions], {}),
    "## Endpoints": ([CompletionBody, InfillRequest, TokenizeBody, DetokenizeBody, ApplyTemplateBody], {}),
}


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start: end if end != -1 else len(text)]


def field_names(model) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


@pytest.mark.parametrize("heading", SECTIONS)
def test_every_field_of_a_dialects_bodies_is_named_in_its_docs_section(heading):
    models, neutral = SECTIONS[heading]
    text = section(DOCS.read_text(), heading)
    names = {name for model in models for name in field_names(model)} | set(neutral)
    spelled = ("`{}`", "`{}.", "`{}:", '"{}"')  # in code, as a path's head, as `name: value`, in a JSON sample
    missing = sorted(name for name in names if not any(form.format(name) in text for form in spelled))
    assert not missing, f"{heading}: not named in docs/server.md: {missing}"
