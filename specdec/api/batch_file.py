"""`specdec generate --input prompts.jsonl --output out.jsonl`: many prompts, batched, resumable.

Input: one JSON object a line, {"prompt": "text"} or {"messages": [{"role": ..., "content": ...}, ...]},
with an optional "id" (any JSON value) copied to the output. Output: one line per prompt as it finishes
(so not in input order), {"index", "id", "text", "token_ids", "finish_reason", "stats"}. A rerun with the
same files skips the prompts already written: an interrupted run loses at most the generations in flight,
and a line cut short by the interruption is dropped before the file is appended to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specdec.api.request import GenerationRequest
from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class BatchPrompt:
    index: int  # line number in the input, from 0
    id: object  # the input's "id", or None
    prompt: str | list  # text, or chat messages


def read_prompts(path: Path) -> list[BatchPrompt]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"{path}: cannot read the prompts ({getattr(exc, 'strerror', None) or exc})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise InvalidParameterError(f'{path}:{number}: expected an object with "prompt" or "messages"')
        prompt = item.get("prompt", item.get("messages"))
        if not isinstance(prompt, (str, list)):
            raise InvalidParameterError(f'{path}:{number}: "prompt" must be text, "messages" a list')
        prompts.append(BatchPrompt(len(prompts), item.get("id"), prompt))
    if not prompts:
        raise InvalidParameterError(f"{path}: no prompts")
    return prompts


def written_indices(path: Path) -> set[int]:
    """The indices an earlier run wrote to `path`; a last line cut short is removed from the file."""
    path = Path(path)
    if not path.exists():
        return set()
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # everything up to the last full line
    if len(complete) != len(data):
        path.write_bytes(complete)
    done = set()
    for number, line in enumerate(complete.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            done.add(int(json.loads(line)["index"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InvalidParameterError(f"{path}:{number}: not a specdec output line; choose a new --output") from None
    return done


def run_batch_file(generator, input_path: Path, output_path: Path, template: GenerationRequest, max_batch: int,
                   progress: bool = True) -> tuple[int, int]:
    """Generate every prompt of input_path not yet in output_path, each with the template's settings;
    (generated now, skipped as done)."""
    prompts = read_prompts(input_path)
    output_path = Path(output_path)
    if not output_path.parent.is_dir():
        raise InvalidParameterError(f"{output_path.parent}: no such directory for --output")
    done = written_indices(output_path)
    todo = [p for p in prompts if p.index not in done]
    requests = [template.replace(prompt=p.prompt) for p in todo]
    for request in requests:  # every prompt checked (template, length) before any generation starts
        generator.prompt_ids(request)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="prompts", unit="prompt",
               disable=not progress)
    with output_path.open("a", encoding="utf-8") as out:
        def write(position: int, result) -> None:
            prompt = todo[position]
            line = {"index": prompt.index, "id": prompt.id, "text": result.text, "token_ids": result.token_ids,
                    "finish_reason": result.finish_reason, "stats": result.stats.to_dict()}
            out.write(json.dumps(line) + "\n")  # one write a line: an interruption cuts at most the last
            out.flush()
            bar.update(1)

        generator.run_batch(requests, max_batch, on_result=write)
    bar.close()
    return len(todo), len(prompts) - len(todo)
