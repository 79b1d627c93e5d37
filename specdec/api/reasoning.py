"""A thinking model's reasoning, returned apart from its answer: `reasoning_content` beside `content`, as
vLLM's reasoning parsers and llama-server's `--reasoning-format deepseek` return it.

Thinking models (Qwen3, DeepSeek-R1 and their distillations, QwQ) write `<think> ... </think>` before the
answer; some chat templates open the block in the prompt itself (the answer then starts inside it).
gpt-oss writes OpenAI's harmony format: `<|channel|>analysis<|message|> ... <|end|>`, then
`<|start|>assistant<|channel|>final<|message|>` and the answer (the markers are kept in the decoded text:
core/text_decoding.py). The split happens on the text as it streams: a marker cut between two rounds' text
is held until it is whole, so the streamed parts join to exactly what the whole reply holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.text_decoding import is_harmony_template
from specdec.errors import InvalidParameterError

OPEN, CLOSE = "<think>", "</think>"
REASONING_FORMATS = ("auto", "deepseek", "none")
# harmony's analysis message, and what opens the final answer after it (or alone, without analysis)
HARMONY_OPEN, HARMONY_CLOSE = "<|channel|>analysis<|message|>", "<|end|>"
HARMONY_ANSWER = ("<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>")


@dataclass(frozen=True)
class Reasoning:
    """How one served model's answers are split."""

    starts_open: bool = False  # the chat template's generation prompt ends inside a <think> block
    open: str = OPEN
    close: str = CLOSE
    answer_markers: tuple[str, ...] = ()  # what may open the answer, left out of it (harmony's final channel)


HARMONY = Reasoning(open=HARMONY_OPEN, close=HARMONY_CLOSE, answer_markers=HARMONY_ANSWER)


def reasoning_for(tokenizer, setting: str) -> Reasoning | None:
    """The split a server applies (None: none, the tags stay in `content`). setting: "auto" (split where the
    chat template writes <think> blocks), "deepseek" (always), "none"."""
    if setting not in REASONING_FORMATS:
        raise InvalidParameterError(f"unknown reasoning format {setting!r} (choose from {', '.join(REASONING_FORMATS)})")
    template = getattr(tokenizer, "chat_template", None) or ""
    if setting == "auto" and is_harmony_template(template):
        return HARMONY
    if setting == "none" or (setting == "auto" and OPEN not in template):
        return None
    return Reasoning(starts_open=_generation_prompt_opens(tokenizer))


def _generation_prompt_opens(tokenizer) -> bool:
    """Whether the template's generation prompt leaves a <think> block open (DeepSeek-R1's does)."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                             tokenize=False)
    except Exception:  # a template that cannot render a bare user turn: the answer opens its own block
        return False
    return isinstance(text, str) and text.rstrip().endswith(OPEN)


class ReasoningStream:
    """One answer's text, fed as it streams, split into (reasoning, content) parts."""

    def __init__(self, reasoning: Reasoning):
        self.open, self.close, self.answer_markers = reasoning.open, reasoning.close, reasoning.answer_markers
        self.state = "reasoning" if reasoning.starts_open else "start"
        self.held = ""  # text not yet given out: a tag possibly cut in two, whitespace at a boundary
        self.strip_next = reasoning.starts_open  # whitespace after a tag is not part of what follows
        self.opened = reasoning.starts_open  # whether the answer has a reasoning block (so far)

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the content this text completes (either may be empty)."""
        self.held += text
        reasoning = content = ""
        if self.state == "start":
            stripped = self.held.lstrip()
            if stripped.startswith(self.open):
                self.state, self.held, self.strip_next, self.opened = "reasoning", stripped[len(self.open):], True, True
            elif self.open.startswith(stripped):
                return "", ""  # maybe the start of <think>: wait
            else:
                self.state = "answer start"
        if self.state == "reasoning":
            if self.strip_next:
                self.held = self.held.lstrip()
                self.strip_next = not self.held
            end = self.held.find(self.close)
            if end < 0:
                keep = _held_suffix(self.held, self.close)
                reasoning, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
                return reasoning, ""
            reasoning = self.held[:end].rstrip()
            self.state, self.held, self.strip_next = "answer start", self.held[end + len(self.close):], True
        if self.state == "answer start":  # harmony: the final channel's marker opens the answer
            stripped = self.held.lstrip()
            marker = next((m for m in self.answer_markers if stripped.startswith(m)), None)
            if marker is None and stripped and any(m.startswith(stripped) for m in self.answer_markers):
                return reasoning, ""  # maybe a marker cut in two: wait
            if marker is not None:
                self.held, self.strip_next = stripped[len(marker):], True
            if marker is not None or stripped:
                self.state = "content"
        if self.strip_next:
            self.held = self.held.lstrip()
            self.strip_next = not self.held
        content, self.held = self.held, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held at the answer's end: an unclosed block's text is reasoning, else content."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held.rstrip(), ""
        return "", held.lstrip() if self.strip_next else held


def split_reasoning(text: str, reasoning: Reasoning) -> tuple[str | None, str]:
    """(reasoning or None when the answer has no block, content) of a whole answer."""
    stream = ReasoningStream(reasoning)
    parts = [stream.feed(text), stream.finish()]
    thought = "".join(part[0] for part in parts)
    return (thought if stream.opened else None), "".join(part[1] for part in parts)


def _held_suffix(text: str, close: str) -> int:
    """How many of text's last characters may begin the closing tag (with the whitespace before it)."""
    keep = next((n for n in range(min(len(close) - 1, len(text)), 0, -1) if close.startswith(text[-n:])), 0)
    body = text[:len(text) - keep]
    return keep + len(body) - len(body.rstrip())
