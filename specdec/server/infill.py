"""Fill-in-the-middle: the text between a prefix and a suffix, for code editors.

Two ways in, one prompt format: OpenAI's `/v1/completions` with `suffix`, and llama.cpp's `/infill` (the
body llama.vim and llama.vscode send: `input_prefix`, `input_suffix`, `input_extra` file chunks), so an
editor plugin written for llama-server works unchanged. The prompt is the model's own FIM format, found by
its tokenizer's FIM tokens (Qwen2.5-Coder's `<|fim_prefix|>`, `<|fim_suffix|>`, `<|fim_middle|>`, with
`<|repo_name|>` / `<|file_sep|>` for other files of the project, as llama.cpp writes them); a model without
them is refused with a 400. The other files' text is what n-gram drafting then copies from.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from specdec.server.llama_server import LlamaSampling
from specdec.server.request_body import BadRequest

REPOSITORY = "myproject"  # the repository name llama.cpp puts before the files, when the model has the token


@dataclass(frozen=True)
class FimFormat:
    prefix: str
    suffix: str
    middle: str
    repository: str | None = None  # the repository-name token (repository-level FIM), if the model has it
    file_separator: str | None = None

    def prompt(self, before: str, after: str, extra: list[tuple[str, str]] = (), filename: str = "",
               lead: str = "") -> str:
        """The text the model completes: the other files (where the format has a file separator), then
        prefix, suffix and the middle marker, then `lead` (text already typed after the cursor's line)."""
        head = ""
        if self.file_separator is not None and (extra or filename):
            head = f"{self.repository}{REPOSITORY}\n" if self.repository else ""
            head += "".join(f"{self.file_separator}{name}\n{text}" for name, text in extra)
            head += f"{self.file_separator}{filename}\n"
        return f"{head}{self.prefix}{before}{self.suffix}{after}{self.middle}{lead}"


KNOWN_FORMATS = [
    FimFormat("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),  # Qwen2.5-Coder
    FimFormat("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<reponame>", "<file_sep>"),  # StarCoder 2
    FimFormat("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    FimFormat("<PRE>", "<SUF>", "<MID>"),  # Code Llama
]


def fim_format(tokenizer) -> FimFormat | None:
    """The model's FIM format, by the special tokens its tokenizer has; None where it has none."""
    vocabulary = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    for known in KNOWN_FORMATS:
        if all(token in vocabulary for token in (known.prefix, known.suffix, known.middle)):
            repository = known.repository if known.repository in vocabulary else None
            separator = known.file_separator if known.file_separator in vocabulary else None
            return FimFormat(known.prefix, known.suffix, known.middle, repository, separator)
    return None


def require_fim(tokenizer, model_name: str, param: str) -> FimFormat:
    found = fim_format(tokenizer)
    if found is None:
        raise BadRequest(f"model {model_name!r} has no fill-in-the-middle tokens; it cannot complete between a "
                         "prefix and a suffix", param)
    return found


class ExtraChunk(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    filename: str = ""
    text: str


class InfillRequest(LlamaSampling):
    """llama.cpp's `/infill` body (the fields editors send; others are ignored)."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""  # text after the middle marker: what is already typed on the cursor's line
