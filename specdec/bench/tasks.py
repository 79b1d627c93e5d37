"""Benchmark prompts: Spec-Bench questions (first turn), the code task, and the editing tasks
(`edit`, `longdoc`, `longedit`: specdec.bench.code_tasks).

Spec-Bench (question.jsonl) groups 480 questions into MT-bench (80, eight
categories), translation, summarization, qa, math_reasoning and rag (80 each).
The code task ships with specdec: five chat-style code-writing requests and five
completion-style prompts (a signature and docstring, no chat template), where
the answer repeats the prompt and lookup drafting shines.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specdec.bench import code_tasks
from specdec.errors import InvalidParameterError

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# an MT-bench category is a task of its own too (writing, roleplay, ...): its prompts alone
TASKS = SPEC_BENCH_TASKS + MT_BENCH_CATEGORIES + ("code", "edit", "longdoc", "longedit")
CODE_PROMPTS = Path(__file__).with_name("data") / "code_prompts.jsonl"


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    prompt_id: str
    prompt: str
    chat: bool  # apply the chat template

    def for_base_model(self) -> "BenchPrompt":
        """The prompt for a model without a chat template (a base model such as Gemma 3 270M): a chat request
        framed as a completion, as evaluation harnesses prompt base models; completion prompts unchanged."""
        if not self.chat:
            return self
        return BenchPrompt(self.task, self.prompt_id, f"Question: {self.prompt}\nAnswer:", False)


def find_spec_bench() -> Path | None:
    """$SPECDEC_SPEC_BENCH, else shared/data/spec_bench/question.jsonl in the working directory or above."""
    if os.environ.get("SPECDEC_SPEC_BENCH"):
        return Path(os.environ["SPECDEC_SPEC_BENCH"])
    for folder in [Path.cwd(), *Path.cwd().parents]:
        candidate = folder / "shared" / "data" / "spec_bench" / "question.jsonl"
        if candidate.exists():
            return candidate
    return None


def load_prompts(tasks: list[str], limit: int, spec_bench: Path | None = None) -> list[BenchPrompt]:
    """Up to `limit` prompts per task, in file order (so runs are comparable)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise InvalidParameterError(f"unknown task(s) {', '.join(unknown)} (choose from {', '.join(TASKS)})")
    if limit < 1:
        raise InvalidParameterError("--limit must be >= 1")
    prompts: list[BenchPrompt] = []
    if any(t in SPEC_BENCH_TASKS or t in MT_BENCH_CATEGORIES for t in tasks):
        path = spec_bench or find_spec_bench()
        if path is None or not path.exists():
            raise InvalidParameterError(
                "Spec-Bench questions not found: pass --spec-bench PATH/question.jsonl or set SPECDEC_SPEC_BENCH"
            )
        by_task: dict[str, list[BenchPrompt]] = {t: [] for t in tasks}
        for line in path.read_text().splitlines():
            question = json.loads(line)
            category = question["category"]
            task = "mt_bench" if category in MT_BENCH_CATEGORIES and category not in by_task else category
            if task in by_task and len(by_task[task]) < limit:
                by_task[task].append(BenchPrompt(task, str(question["question_id"]), question["turns"][0], True))
        for task in tasks:
            prompts.extend(by_task.get(task, []))
    if "code" in tasks:
        code = [json.loads(line) for line in CODE_PROMPTS.read_text().splitlines()]
        # alternate chat-style and completion-style prompts so a small limit gets both kinds
        chat = [c for c in code if c["chat"]]
        completion = [c for c in code if not c["chat"]]
        mixed = [c for pair in zip(chat, completion) for c in pair]
        prompts.extend(BenchPrompt("code", c["id"], c["prompt"], c["chat"]) for c in mixed[:limit])
    for task, made in (("edit", code_tasks.edit_prompts), ("longdoc", code_tasks.longdoc_prompts),
                       ("longedit", code_tasks.long_edit_prompts)):
        if task in tasks:
            prompts.extend(BenchPrompt(task, name, prompt, True) for name, prompt in made()[:limit])
    return prompts
