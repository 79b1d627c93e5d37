"""A retrieval datastore (REST, He et al. 2023): token sequences of a corpus and their suffix array.

`specdec datastore build CORPUS... --target NAME --out DIR` tokenizes text files (directories are
walked for .py/.md/.rst/.txt/.json/.jsonl/.c/.h/.js/.ts/.java/.go/.rs files) with the target's tokenizer,
joins them with a separator id (the vocabulary size: never a real token) and sorts all suffixes with
libdivsufsort (pydivsufsort). DIR holds tokens.npy (int32), suffixes.npy (int64) and datastore.json
(tokenizer sha256, sizes, sources). Queries binary-search the suffix array for the longest suffix of the
context that occurs in the corpus and return what followed its occurrences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specdec.errors import CorruptModelError, InvalidParameterError
from specdec.models.fingerprint import tokenizer_sha256
from specdec.paths import building_directory

TEXT_SUFFIXES = {".py", ".md", ".rst", ".txt", ".json", ".jsonl", ".c", ".h", ".js", ".ts", ".java", ".go", ".rs"}
FORMAT_VERSION = 1


def corpus_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidParameterError(f"{path}: no such file or directory")
    if not files:
        raise InvalidParameterError("the corpus has no text files")
    return files


def build_datastore(paths: list[Path], tokenizer, vocab_size: int, out_dir: Path, target_name: str,
                    progress: bool = True) -> dict:
    """Tokenize, join and index the corpus; write DIR atomically; returns datastore.json's dict."""
    from pydivsufsort import divsufsort
    files = corpus_files([Path(p) for p in paths])
    pieces: list[np.ndarray] = []
    separator = np.array([vocab_size], dtype=np.int32)
    for file in tqdm(files, desc="tokenize", unit="file", disable=not progress):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary or unreadable: not text for this datastore
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids:
            pieces += [np.asarray(ids, dtype=np.int32), separator]
    if not pieces:
        raise InvalidParameterError("the corpus has no readable UTF-8 text")
    tokens = np.concatenate(pieces)
    suffixes = divsufsort(tokens.astype(np.uint32)).astype(np.int64)
    info = {"format_version": FORMAT_VERSION, "target": target_name, "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "separator": int(vocab_size), "tokens": int(tokens.shape[0]), "files": len(files),
            "sources": [str(p) for p in paths]}
    with building_directory(Path(out_dir)) as partial:
        np.save(partial / "tokens.npy", tokens)
        np.save(partial / "suffixes.npy", suffixes)
        (partial / "datastore.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


@dataclass
class Datastore:
    tokens: np.ndarray  # (n,) int32, memory-mapped
    suffixes: np.ndarray  # (n,) int64: start positions of the suffixes in lexicographic order
    info: dict

    @classmethod
    def open(cls, path: Path, tokenizer) -> "Datastore":
        path = Path(path).expanduser()
        meta = path / "datastore.json"
        if not meta.is_file():
            raise InvalidParameterError(f"{path}: not a datastore (build one with `specdec datastore build`)")
        try:
            info = json.loads(meta.read_text())
            tokens = np.load(path / "tokens.npy", mmap_mode="r")
            suffixes = np.load(path / "suffixes.npy", mmap_mode="r")
        except (OSError, ValueError, json.JSONDecodeError) as exc:
            raise CorruptModelError(f"{path}: unreadable datastore ({exc})") from None
        if info.get("format_version") != FORMAT_VERSION or tokens.shape != suffixes.shape:
            raise CorruptModelError(f"{path}: not a datastore of this specdec version")
        if info["tokenizer_sha256"] != tokenizer_sha256(tokenizer):
            raise InvalidParameterError(f"{path}: built with {info['target']!r}'s tokenizer, which differs from the "
                                        "target's; rebuild it with --target")
        return cls(tokens, suffixes, info)

    def _bound(self, pattern: np.ndarray, upper: bool) -> int:
        """First suffix index whose first len(pattern) tokens are >= pattern (> pattern when upper)."""
        low, high, length = 0, self.suffixes.shape[0], pattern.shape[0]
        target = tuple(pattern.tolist())
        while low < high:
            mid = (low + high) // 2
            start = int(self.suffixes[mid])
            probe = tuple(self.tokens[start: start + length].tolist())
            if probe < target or (upper and probe == target):
                low = mid + 1
            else:
                high = mid
        return low

    def occurrences(self, pattern: np.ndarray, limit: int) -> np.ndarray:
        """Start positions (up to `limit`) of occurrences of pattern."""
        first = self._bound(pattern, upper=False)
        last = self._bound(pattern, upper=True)
        return np.asarray(self.suffixes[first: min(last, first + limit)])

    def continuations(self, context: list[int], max_suffix: int, min_suffix: int, limit: int,
                      length: int) -> list[list[int]]:
        """What followed the longest suffix of `context` (max_suffix down to min_suffix tokens) found in the
        corpus: up to `limit` continuations of up to `length` tokens (cut at document ends)."""
        separator = self.info["separator"]
        for size in range(min(max_suffix, len(context)), min_suffix - 1, -1):
            starts = self.occurrences(np.asarray(context[-size:], dtype=np.int32), limit)
            starts = starts[starts + size < self.tokens.shape[0]]
            if starts.shape[0] == 0:
                continue
            found = []
            for start in starts.tolist():
                follow = self.tokens[start + size: start + size + length].tolist()
                if separator in follow:
                    follow = follow[: follow.index(separator)]
                if follow:
                    found.append(follow)
            if found:
                return found
        return []
