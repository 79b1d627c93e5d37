"""How `specdec generate` prints a thinking model's chat answer: the `<think>` block left out by default,
or with --show-reasoning printed before the answer, dimmed on a terminal (in its tags when piped, so the
two stay apart), the answer as it streams either way."""

from __future__ import annotations

import sys
from typing import TextIO

from specdec.api.reasoning import CLOSE, OPEN, Reasoning, ReasoningStream

DIM, RESET = "\033[2m", "\033[0m"


class AnswerPrinter:
    """Prints streamed chunks' text; with `reasoning` (the split api/reasoning.py makes) the reasoning part
    is shown or omitted as `show_reasoning` says."""

    def __init__(self, reasoning: Reasoning | None, show_reasoning: bool, out: TextIO | None = None):
        self.stream = ReasoningStream(reasoning) if reasoning is not None else None
        self.out = out or sys.stdout  # looked up now: a caller may have replaced it
        self.show, self.terminal = show_reasoning, self.out.isatty()
        self.state = "start"  # "reasoning" once some is printed, "answer" once the answer starts
        self.omitted = False  # whether a reasoning block was left out

    def __call__(self, chunk) -> None:
        self._write(*(self.stream.feed(chunk.text) if self.stream else ("", chunk.text)))

    def finish(self) -> None:
        """Prints what the split still held (an unclosed block's text, a cut tag's first characters)."""
        if self.stream is not None:
            self._write(*self.stream.finish())
        if self.state == "reasoning":
            self._close_reasoning()

    def _write(self, thought: str, answer: str) -> None:
        if thought and not self.show:
            self.omitted = True
        elif thought:
            if self.state == "start":
                self.out.write(DIM if self.terminal else f"{OPEN}\n")
                self.state = "reasoning"
            self.out.write(thought)
        if answer:
            if self.state == "reasoning":
                self._close_reasoning()
            self.state = "answer"
            self.out.write(answer)
        self.out.flush()

    def _close_reasoning(self) -> None:
        self.out.write(f"{RESET}\n\n" if self.terminal else f"\n{CLOSE}\n\n")
        self.state = "answer"
