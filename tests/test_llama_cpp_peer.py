"""The llama.cpp peer of `specdec bench`: reading its programs' timings, and one clear error without them.
(Running llama.cpp itself needs a build, which CI does not have: docs/notes/benchmarks-diary-2026.md section 11.)"""

import subprocess
import sys

import pytest

from specdec.bench.llama_cpp import LlamaCppMode, parse_peer, parse_timings
from specdec.errors import InvalidParameterError, PeerError

# Lines as llama.cpp 0c1e570 prints them (llama-completion, llama-speculative-simple).
COMPLETION_LOG = """\
0.06.995.856 I common_perf_print:        load time =     430.48 ms
0.06.995.875 I common_perf_print: prompt eval time =     430.08 ms /     7 tokens (   61.44 ms per token,    16.28 tokens per second)
0.06.995.894 I common_perf_print:        eval time =    2326.20 ms /    63 runs   (   36.92 ms per token,    27.08 tokens per second)
0.06.995.911 I common_perf_print:       total time =    2779.56 ms /    70 tokens
"""
SPECULATIVE_LOG = """\
0.06.691.365 I encoded    7 tokens in    0.201 seconds, speed:   34.834 t/s
0.06.691.366 I decoded   68 tokens in    4.103 seconds, speed:   16.572 t/s
0.06.691.367 I n_draft   = 3
"""


def test_parse_timings():
    tokens, seconds = parse_timings(COMPLETION_LOG, False, 64)
    assert tokens == 64 and seconds == pytest.approx(2.75628)  # prompt + generation, not load
    tokens, seconds = parse_timings(SPECULATIVE_LOG, True, 100)
    assert tokens == 68 and seconds == pytest.approx(4.304)
    tokens, seconds = parse_timings(SPECULATIVE_LOG, True, 34)  # drafted past -n: counted to the limit
    assert tokens == 34 and seconds == pytest.approx(0.201 + 4.103 / 2)
    with pytest.raises(PeerError, match="timings.*error: something else$"):
        parse_timings("main: loading\nerror: something else\n", False, 64)


def test_peer_specs_name_llama_cpp_modes():
    plain, *ngram = parse_peer("llamacpp-best", None)
    assert plain == LlamaCppMode() and all(len(mode.spec_types) == 1 for mode in ngram)
    with_draft = parse_peer("llamacpp-best", "qwen2.5-coder-0.5b-instruct")
    assert LlamaCppMode(("draft-simple",), 8, "qwen2.5-coder-0.5b-instruct") in with_draft
    assert parse_peer("llamacpp-spec:ngram-mod+draft-simple@16:small", None) == [
        LlamaCppMode(("ngram-mod", "draft-simple"), 16, "small")]
    assert parse_peer("llamacpp-draft:small", None)[0].name == "llama.cpp-spec:draft-simple:small"
    assert parse_peer("lookup", None) == []
    with pytest.raises(InvalidParameterError, match="draft length"):
        parse_peer("llamacpp-draft:small@0", None)


def test_best_peer_row_takes_the_fastest_mode_per_task():
    from specdec.bench.report import BEST_PEER, add_best_peer

    summary = {"plain": {"code": {"tokens_per_second": 10.0}},
               "llama.cpp": {"code": {"tokens_per_second": 8.0}, "qa": {"tokens_per_second": 9.0}},
               "llama.cpp-spec:ngram-mod": {"code": {"tokens_per_second": 12.0}, "qa": {"tokens_per_second": 7.0}}}
    add_best_peer(summary)
    assert summary[BEST_PEER]["code"]["best_of"] == "llama.cpp-spec:ngram-mod"
    assert summary[BEST_PEER]["qa"]["best_of"] == "llama.cpp"


def test_missing_llama_cpp_is_one_clear_line(tiny_dirs, tmp_path, monkeypatch):
    from specdec.bench.llama_cpp import find_program

    monkeypatch.setenv("SPECDEC_LLAMA_CPP", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InvalidParameterError, match="SPECDEC_LLAMA_CPP"):
        find_program("llama-completion")
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "bench", "--target", str(tiny_dirs["llama"]),
                           "--peers", "llamacpp", "--tasks", "code", "--limit", "1", "--roofline-mb", "0"],
                          capture_output=True, text=True, env={**__import__("os").environ, "PATH": str(tmp_path)})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "llama-completion" in done.stderr.strip().splitlines()[-1]


def test_a_failing_llama_cpp_ends_bench_with_one_clear_line(tmp_path):
    """llama.cpp that exits non-zero (a file it cannot load, a flag it does not know) ends `specdec bench` with
    one line naming the peer and llama.cpp's own last line, no traceback and no results file."""
    from tiny_models import make_hf_model, write_tiny_gguf

    target = write_tiny_gguf(tmp_path / "tiny.gguf", make_hf_model("llama", seed=3), "Q8_0")
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "llama-completion"
    program.write_text("#!/bin/sh\necho 'llama_model_load: loading' >&2\n"
                       "echo 'error: unknown model architecture' >&2\nexit 1\n")
    program.chmod(0o755)
    results = tmp_path / "results.json"
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "bench", "--target", str(target), "--peers", "llamacpp",
                           "--drafters", "ngram", "--tasks", "code", "--limit", "1", "--max-new-tokens", "4",
                           "--roofline-mb", "0", "--json", str(results)],
                          capture_output=True, text=True, env={**__import__("os").environ, "SPECDEC_LLAMA_CPP": str(folder)})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("specdec: error: peer llama.cpp: llama-completion exited with 1: "
                                                     "error: unknown model architecture")
    assert not results.exists()
