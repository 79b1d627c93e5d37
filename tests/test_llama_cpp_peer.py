"""The llama.cpp peer of `specdec bench`: reading its programs' timings, and one clear error without them.
(Running llama.cpp itself needs a build, which CI does not have: docs/notes/benchmarks-diary-2026.md section 11.)"""

import subprocess
import sys

import pytest

from specdec.bench.llama_cpp import parse_timings
from specdec.errors import InvalidParameterError

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
    tokens, seconds = parse_timings(COMPLETION_LOG, "plain")
    assert tokens == 64 and seconds == pytest.approx(2.75628)  # prompt + generation, not load
    tokens, seconds = parse_timings(SPECULATIVE_LOG, "draft")
    assert tokens == 68 and seconds == pytest.approx(4.304)
    with pytest.raises(RuntimeError, match="timings"):
        parse_timings("error: something else", "plain")


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
