"""An offline training corpus: text that ships with Python on this machine, plus the target's own answers.

No dataset hub is reachable, so the corpus is built from what every install has:
- code: Python source files of the standard library and installed packages;
- prose: package documentation (the long descriptions in *.dist-info/METADATA, README/*.md/*.rst files);
- self-generated: answers the target writes to instructions made from docstrings and package summaries
  (the distribution a drafter meets at inference: the target's own chat replies).
Each piece is wrapped in the target's chat template as an assistant reply, since drafting happens there,
then all pieces are packed into fixed-length token windows (no padding, no wasted compute).
Selection is deterministic for a seed.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

TEST_DIRS = {"test", "tests"}  # test suites are full of deliberately odd code
CODE_INSTRUCTIONS = ["Write the Python code.", "Show me an example implementation in Python.",
                     "Write a Python module for this.", "Give me the code."]
PROSE_INSTRUCTIONS = ["Explain this library.", "Write the documentation.", "Describe how to use it.",
                      "Write a README."]


@dataclass(frozen=True)
class CorpusConfig:
    code_tokens: int = 160_000
    prose_tokens: int = 80_000
    generated_answers: int = 1024  # answers the target writes (specdec.training.self_generation)
    answer_tokens: int = 200
    window: int = 256  # tokens per training window
    max_piece_chars: int = 3_000
    seed: int = 0


def python_roots() -> list[Path]:
    paths = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    return sorted(Path(p) for p in paths if p and Path(p).is_dir())


def source_files(pattern_suffixes: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for root in python_roots():
        for path in root.rglob("*"):
            if path.suffix in pattern_suffixes and path.is_file() and not TEST_DIRS & set(path.parts):
                files.append(path)
    return sorted(set(files))


def doc_files() -> list[Path]:
    docs = [p for p in source_files((".md", ".rst", ".txt")) if p.stat().st_size > 500]
    for root in python_roots():
        docs += sorted(root.glob("*.dist-info/METADATA"))
    return sorted(set(docs))


def read_piece(path: Path, max_chars: int, rng: random.Random) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if path.name == "METADATA":  # the long description follows the headers
        text = text.partition("\n\n")[2]
    text = text.strip()
    if len(text) < 200:
        return None
    start = rng.randrange(0, max(1, len(text) - max_chars)) if len(text) > max_chars else 0
    if start:  # begin at a line start
        start = text.find("\n", start) + 1
    return text[start: start + max_chars]


def chat_ids(tokenizer, instruction: str, answer: str | None = None) -> list[int]:
    """The token ids of a user instruction and, when given, the assistant's answer; without an answer the
    prompt ends ready for the assistant to write one. Plain text when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": instruction}]
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=answer is None, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer.encode(instruction if answer is None else f"{instruction}\n{answer}")


def pieces(files: list[Path], instructions: list[str], budget: int, tokenizer, config: CorpusConfig,
           rng: random.Random) -> Iterator[list[int]]:
    order = list(files)
    rng.shuffle(order)
    produced = 0
    for path in order:
        if produced >= budget:
            return
        text = read_piece(path, config.max_piece_chars, rng)
        if text is None:
            continue
        ids = chat_ids(tokenizer, rng.choice(instructions), text)
        produced += len(ids)
        yield ids


def generation_prompts(count: int, rng: random.Random) -> list[str]:
    """Instructions made from docstrings of installed Python code: two thirds "write this function",
    one third "explain this module"; what users ask a small chat/code model."""
    code: list[str] = []
    prose: list[str] = []
    files = source_files((".py",))
    rng.shuffle(files)
    for path in files:
        if len(code) >= count * 2 // 3 and len(prose) >= count - count * 2 // 3:
            break
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        module_doc = ast.get_docstring(tree)
        if module_doc and 20 < len(module_doc.splitlines()[0]) < 120:
            prose.append(f"Explain what a Python module for this does, with an example: "
                         f"{module_doc.splitlines()[0].strip()}")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and 20 < len(doc.splitlines()[0]) < 120:
                    line = doc.splitlines()[0].strip().rstrip(".")
                    code.append(f"Write a Python function `{node.name}`: {line[0].lower()}{line[1:]}.")
                    break
    prompts = code[: count * 2 // 3] + prose[: count - count * 2 // 3]
    rng.shuffle(prompts)
    return prompts


def pack_windows(sequences: list[list[int]], window: int) -> list[list[int]]:
    """Concatenate the sequences and cut the stream into windows of exactly `window` tokens."""
    stream = [token for sequence in sequences for token in sequence]
    return [stream[i: i + window] for i in range(0, len(stream) - window + 1, window)]


def build_corpus(tokenizer, config: CorpusConfig) -> list[list[int]]:
    """Token windows (each `config.window` long) of code and prose for a target's tokenizer."""
    rng = random.Random(config.seed)
    sequences = list(pieces(source_files((".py",)), CODE_INSTRUCTIONS, config.code_tokens, tokenizer, config, rng))
    sequences += list(pieces(doc_files(), PROSE_INSTRUCTIONS, config.prose_tokens, tokenizer, config, rng))
    rng.shuffle(sequences)
    return pack_windows(sequences, config.window)
