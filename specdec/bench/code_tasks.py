"""The bench's code-editing tasks, on real code nobody here wrote: the running Python's standard library.

`edit`: one function or method and an instruction whose answer mostly repeats it (add type hints, rename,
restyle a docstring, translate comments, swap prints for logging): the work a coding assistant is asked
most, where a drafter that copies runs furthest. Ask for 256 or more new tokens (`--max-new-tokens`).

`longdoc`: a whole module (2-4k tokens) and a question whose answer quotes one of its functions: long
prompts, where a draft model's own prefill of the context costs what lookup never pays.

`longedit`: a whole module of ~4k tokens and an edit of one of its functions, answered with that function:
an edit deep in a long file, where each verification attends over the whole context.

The sources come from `inspect.getsource`, so the prompts follow the Python version that runs the bench
(the report names it); each is fixed for a given version.
"""

from __future__ import annotations

import argparse
import configparser
import csv
import difflib
import glob
import heapq
import inspect
import selectors
import shlex
import string
import textwrap
import warnings

# (id, the object whose source is edited, the instruction)
EDITS = (
    ("type-hints-wrap-chunks", lambda: textwrap.TextWrapper._wrap_chunks,
     "Add type hints to this method's signature. Keep the body, comments and docstring exactly as they are."),
    ("rename-heapq-merge", lambda: heapq.merge,
     "Rename the local variable `h` to `heap` everywhere in this function. Change nothing else."),
    ("docstring-unified-diff", lambda: difflib.unified_diff,
     "Rewrite this function's docstring in Google style (Args:, Returns:, Example:). Keep the code unchanged."),
    ("french-comments-format-usage", lambda: argparse.HelpFormatter._format_usage,
     "Translate every comment in this method into French. Keep the code unchanged."),
    ("type-hints-matching-blocks", lambda: difflib.SequenceMatcher.get_matching_blocks,
     "Add type hints to this method and to its local variables where the type is not obvious. "
     "Keep everything else."),
    ("rename-configparser-read", lambda: configparser.RawConfigParser._read,
     "Rename the parameter `fpname` to `source_name` everywhere in this method. Change nothing else."),
    ("logging-read-token", lambda: shlex.shlex.read_token,
     "Replace each `print(...)` debugging call with `logger.debug(...)` (same message). Change nothing else."),
    ("docstring-iglob", lambda: glob._iglob,
     "Add a docstring to this function that explains each parameter. Keep the code unchanged."),
)

# (id, module, the function its answer quotes)
QUOTES = (
    ("quote-shlex-get-token", lambda: shlex, "shlex.get_token"),
    ("quote-string-vformat", lambda: string, "Formatter._vformat"),
    ("quote-glob-iterdir", lambda: glob, "_iterdir"),
    ("quote-string-safe-substitute", lambda: string, "Template.safe_substitute"),
)

# (id, module of ~4k tokens, the function edited, the instruction)
LONG_EDITS = (
    ("longedit-textwrap-hints", lambda: textwrap, "TextWrapper._wrap_chunks",
     "Add type hints to the signature of this method. Keep the body, comments and docstring exactly as they are."),
    ("longedit-csv-rename", lambda: csv, "Sniffer._guess_delimiter",
     "Rename the local variable `charFrequency` to `char_frequency` everywhere in this method. "
     "Change nothing else."),
    ("longedit-warnings-french", lambda: warnings, "_formatwarnmsg_impl",
     "Translate every comment in this function into French. Keep the code unchanged."),
    ("longedit-selectors-docstring", lambda: selectors, "_PollLikeSelector.select",
     "Add a docstring to this method that explains its parameter and what it returns. Keep the code unchanged."),
)


def edit_prompts() -> list[tuple[str, str]]:
    """(id, chat prompt) per edit whose function this Python version has."""
    prompts = []
    for name, source, instruction in EDITS:
        try:
            code = textwrap.dedent(inspect.getsource(source()))
        except AttributeError:  # renamed or gone in this Python version
            continue
        prompts.append((name, f"{instruction} Reply with the whole function in one Python code block.\n\n"
                              f"```python\n{code}```"))
    return prompts


def longdoc_prompts() -> list[tuple[str, str]]:
    """(id, chat prompt) per quoting question over a whole module."""
    return [(name, f"```python\n{inspect.getsource(module())}```\n\nQuote the definition of `{function}` from the "
                   "file above exactly, in a Python code block, then explain in two sentences what it does.")
            for name, module, function in QUOTES]


def long_edit_prompts() -> list[tuple[str, str]]:
    """(id, chat prompt) per edit of one function inside a whole module, where this Python version has it."""
    prompts = []
    for name, module, function, instruction in LONG_EDITS:
        source = inspect.getsource(module())
        if f"def {function.rsplit('.', 1)[-1]}(" not in source:  # renamed or gone in this Python version
            continue
        prompts.append((name, f"```python\n{source}```\n\nIn the file above, edit `{function}`: {instruction} "
                              "Reply with the whole edited function in one Python code block."))
    return prompts
