"""llama.cpp as a peer in `specdec bench`: its own programs on the GGUF file the zoo pulled, greedy, the
same prompt tokens, the same thread count.

    --peers llamacpp                     llama-completion (plain decoding)
    --peers llamacpp-draft:MODEL[@N]     llama-speculative-simple with MODEL's GGUF as the draft (N draft tokens
                                         a round, its --spec-draft-n-max; its default 3)
    --peers llamacpp-spec:TYPES[@N][:MODEL]  llama-speculative-simple --spec-type TYPES ('+'-joined chain such
                                         as ngram-mod+draft-simple; MODEL: the draft for draft-simple)
    --peers llamacpp-best                each of the above that suits the target (its n-gram types, its zoo
                                         draft at n-max 3 and 8, a chain); the report's "llama.cpp best" row
                                         takes the fastest per task and names it

Its speculative program drafts past `-n` (a round is committed whole): tokens beyond the limit are not
counted, and its decode time is scaled to the tokens counted.

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
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.peers import PeerRun
from specdec.errors import InvalidParameterError, PeerError
from specdec.models.sources import zoo

NGRAM_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache")
BEST_PREFIX = "llama.cpp"  # every llama.cpp method's name starts so; the report's best row reads them


@dataclass(frozen=True)
class LlamaCppMode:
    """One way to run llama.cpp: plain, or speculative with `spec_types` (its --spec-type list)."""

    spec_types: tuple[str, ...] = ()
    n_max: int | None = None  # --spec-draft-n-max (draft types); None: its default
    draft: str | None = None  # the draft model spec for draft-simple

    @property
    def name(self) -> str:
        if not self.spec_types:
            return BEST_PREFIX
        return (f"{BEST_PREFIX}-spec:{'+'.join(self.spec_types)}" + (f"@{self.n_max}" if self.n_max else "")
                + (f":{self.draft}" if self.draft else ""))


def parse_peer(peer: str, default_draft: str | None) -> list[LlamaCppMode]:
    """The llama.cpp modes a `--peers` entry names (module docstring); [] when it names no llama.cpp peer."""
    mode, _, rest = peer.partition(":")
    if mode == "llamacpp" and not rest:
        return [LlamaCppMode()]
    if mode == "llamacpp-best" and not rest:
        modes = [LlamaCppMode()] + [LlamaCppMode((kind,)) for kind in NGRAM_TYPES]
        if default_draft:
            modes += [LlamaCppMode(("draft-simple",), n, default_draft) for n in (3, 8)]
            modes.append(LlamaCppMode(("ngram-mod", "draft-simple"), 8, default_draft))
        return modes
    if mode == "llamacpp-draft":
        model, _, n_max = rest.partition("@")
        return [LlamaCppMode(("draft-simple",), _draft_tokens(n_max, peer), model or default_draft)]
    if mode == "llamacpp-spec":
        types_and_n, _, model = rest.partition(":")
        types, _, n_max = types_and_n.partition("@")
        kinds = tuple(kind for kind in types.split("+") if kind)
        if not kinds:
            raise InvalidParameterError(f"peer {peer!r}: name llama.cpp --spec-type values, e.g. llamacpp-spec:ngram-mod")
        draft = (model or default_draft) if "draft-simple" in kinds else None
        return [LlamaCppMode(kinds, _draft_tokens(n_max, peer), draft)]
    return []


def _draft_tokens(text: str, peer: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise InvalidParameterError(f"peer {peer!r}: @N takes a draft length from 1 to 64")
    return int(text)


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
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    if spec in zoo.REGISTRY and zoo.is_pulled(spec):
        manifest = json.loads((zoo.model_dir(spec) / "manifest.json").read_text())
        return zoo.model_dir(spec) / manifest["gguf"]
    raise InvalidParameterError(f"llama.cpp peer: {spec!r} is neither a .gguf file nor a pulled zoo model")


class LlamaCppPeer:
    """llama-completion (plain) or llama-speculative-simple (any --spec-type chain) on the target's GGUF."""

    def __init__(self, target_spec: str, mode: LlamaCppMode, tokenizer, threads: int):
        self.mode, self.tokenizer, self.threads = mode, tokenizer, threads
        self.speculative = bool(mode.spec_types)
        self.program = find_program("llama-speculative-simple" if self.speculative else "llama-completion")
        self.target = gguf_file(target_spec)
        if "draft-simple" in mode.spec_types and not mode.draft:
            raise InvalidParameterError(f"peer {mode.name}: draft-simple needs a draft model (...:MODEL)")
        self.draft = gguf_file(mode.draft) if mode.draft else None

    @property
    def name(self) -> str:
        return self.mode.name

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: tuple[int, ...]) -> PeerRun:
        _, log = self.complete(self.tokenizer.decode(prompt_ids), max_new_tokens, len(prompt_ids))
        tokens, seconds = parse_timings(log, self.speculative, max_new_tokens)
        return PeerRun(tokens, seconds, None)

    def complete(self, prompt_text: str, max_new_tokens: int, prompt_tokens: int = 0) -> tuple[str, str]:
        """llama.cpp's greedy continuation of prompt_text: (its text, the program's whole log). The text is
        what it printed after the prompt (plain mode: without the prompt and its end marker)."""
        # a context for the prompt and the answer (with room for a round drafted past -n); its speculative
        # program takes the whole prompt as one batch, so the logical batch is the context (the physical
        # one, -ub, stays at its default: the prefill runs as it always does)
        context = max(8192, prompt_tokens + max_new_tokens + 64)
        with tempfile.TemporaryDirectory() as folder:
            prompt = Path(folder) / "prompt.txt"
            prompt.write_text(prompt_text, encoding="utf-8")
            # -bf reads the file as it is; -f drops a final newline, which every chat prompt ends with
            command = [str(self.program), "-m", str(self.target), "-bf", str(prompt), "-n", str(max_new_tokens),
                       "-t", str(self.threads), "--temp", "0", "-c", str(context), "-b", str(context)]
            if self.speculative:
                command += ["--spec-type", ",".join(self.mode.spec_types)]
                if self.mode.n_max:
                    command += ["--spec-draft-n-max", str(self.mode.n_max)]
                if self.draft:
                    command += ["-md", str(self.draft), "-td", str(self.threads)]
            else:
                command += ["-no-cnv", "--no-display-prompt"]
            done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise PeerError(f"peer {self.name}: {self.program.name} exited with {done.returncode}: "
                            f"{last_line(done.stderr)}")
        return done.stdout.replace(" [end of text]", ""), done.stderr + done.stdout


def parse_timings(log: str, speculative: bool, max_new_tokens: int) -> tuple[int, float]:
    """(generated tokens up to the limit, seconds of prompt processing + generation) from a llama.cpp log."""
    if speculative:
        encoded = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", log)
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        if encoded and decoded:
            tokens = int(decoded.group(1))
            counted = min(tokens, max_new_tokens)  # a round drafted past -n is committed whole
            return counted, float(encoded.group(1)) + float(decoded.group(2)) * counted / max(tokens, 1)
    else:
        prompt = re.search(r"prompt eval time =\s+([\d.]+) ms", log)
        generation = re.search(r"\seval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
        if prompt and generation:  # the first new token comes from the prompt's logits
            return int(generation.group(2)) + 1, (float(prompt.group(1)) + float(generation.group(1))) / 1e3
    raise PeerError(f"could not read llama.cpp's timings from its log, which ends: {last_line(log)}")


def last_line(log: str) -> str:
    """A program's log as one line of an error: its last non-empty line (where llama.cpp says what failed)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(nothing)"
