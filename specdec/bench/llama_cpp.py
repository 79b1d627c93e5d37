"""llama.cpp as a peer in `specdec bench`: its own programs on the GGUF file the zoo pulled, greedy, the
same prompt tokens, the same thread count.

    --peers llamacpp                     llama-completion (plain decoding)
    --peers llamacpp-draft:MODEL         llama-speculative-simple with MODEL's GGUF as the draft

Checked with llama.cpp 0c1e570 (October 2026, the source llama-cpp-python 0.3.36 vendors), built with
`cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build --target llama-completion
llama-speculative-simple` (docs/performance.md). On CPUs with AMX, build with `-DGGML_NATIVE=OFF` and the
AVX-512 options (`-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON ...`): its AMX path crashed in a VM here.

The programs come from $SPECDEC_LLAMA_CPP (a llama.cpp build's bin/ folder) or PATH. Speed is what the
program reports for prompt processing + generation (model loading excluded, as our own load is), over the
tokens it generated; its outputs are not compared with ours (other weights: its GGUF blocks, our
float32/int4/int7 conversions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from specdec.bench.peers import PeerRun
from specdec.errors import InvalidParameterError

PROGRAMS = {"plain": "llama-completion", "draft": "llama-speculative-simple"}


def find_program(name: str) -> Path:
    folder = os.environ.get("SPECDEC_LLAMA_CPP")
    found = Path(folder) / name if folder else None
    if found is None or not found.is_file():
        where = shutil.which(name)
        found = Path(where) if where else None
    if found is None:
        raise InvalidParameterError(f"llama.cpp peer: no {name} found (set SPECDEC_LLAMA_CPP to the bin/ folder "
                                    "of a llama.cpp build, or put it on PATH)")
    return found


def gguf_file(spec: str) -> Path:
    """The GGUF behind a model spec: a .gguf path, or the file a zoo model was pulled as."""
    from specdec.models.sources import zoo

    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    if spec in zoo.REGISTRY and zoo.is_pulled(spec):
        manifest = json.loads((zoo.model_dir(spec) / "manifest.json").read_text())
        return zoo.model_dir(spec) / manifest["gguf"]
    raise InvalidParameterError(f"llama.cpp peer: {spec!r} is neither a .gguf file nor a pulled zoo model")


class LlamaCppPeer:
    """`mode` "plain" (llama-completion) or "draft" (llama-speculative-simple, needs draft_spec)."""

    def __init__(self, target_spec: str, mode: str, tokenizer, threads: int, draft_spec: str | None = None):
        self.mode, self.tokenizer, self.threads = mode, tokenizer, threads
        self.program = find_program(PROGRAMS[mode])
        self.target = gguf_file(target_spec)
        self.draft = gguf_file(draft_spec) if mode == "draft" else None

    @property
    def name(self) -> str:
        return "llama.cpp" if self.mode == "plain" else "llama.cpp-draft"

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: tuple[int, ...]) -> PeerRun:
        with tempfile.TemporaryDirectory() as folder:
            prompt = Path(folder) / "prompt.txt"
            prompt.write_text(self.tokenizer.decode(prompt_ids))
            command = [str(self.program), "-m", str(self.target), "-f", str(prompt), "-n", str(max_new_tokens),
                       "-t", str(self.threads), "--temp", "0", "-c", "4096"]
            if self.mode == "draft":  # its defaults otherwise (3 draft tokens per round)
                command += ["-md", str(self.draft), "-td", str(self.threads), "--spec-type", "draft-simple"]
            else:
                command += ["-no-cnv"]
            done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{self.program.name} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        tokens, seconds = parse_timings(done.stderr + done.stdout, self.mode)
        return PeerRun(tokens, seconds, None)


def parse_timings(log: str, mode: str) -> tuple[int, float]:
    """(generated tokens, seconds of prompt processing + generation) from a llama.cpp program's log."""
    if mode == "draft":
        encoded = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", log)
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        if encoded and decoded:
            return int(decoded.group(1)), float(encoded.group(1)) + float(decoded.group(2))
    else:
        prompt = re.search(r"prompt eval time =\s+([\d.]+) ms", log)
        generation = re.search(r"\seval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
        if prompt and generation:  # the first new token comes from the prompt's logits
            return int(generation.group(2)) + 1, (float(prompt.group(1)) + float(generation.group(1))) / 1e3
    raise RuntimeError(f"could not read llama.cpp's timings from its log: {log.strip()[-300:]}")
