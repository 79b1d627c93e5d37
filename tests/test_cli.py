"""The CLI: generation on a tiny model, JSON output, and one-line errors with a non-zero exit."""

import json
import os
import subprocess
import sys

import pytest
import torch

from specdec.cli import main
from tiny_models import make_hf_model, write_tiny_gguf


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env)


def test_generate_json(tiny_dirs, capsys):
    assert main(["generate", "hello", "--target", str(tiny_dirs["llama"]), "--drafter", "none",
                 "--max-new-tokens", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 7 or out["finish_reason"] == "stop"
    assert out["stats"]["new_tokens"] == len(out["token_ids"])
    assert out["stats"]["prompt_tokens"] > 0 and out["stats"]["tokens_per_second"] > 0


def test_generate_streams_to_stdout(tiny_dirs, capsys):
    threads = torch.get_num_threads()
    try:
        assert main(["generate", "hello", "--target", str(tiny_dirs["qwen2"]), "--drafter", "ngram", "--k", "3",
                     "--max-new-tokens", "12", "--no-chat", "--seed", "1", "--temperature", "0.8",
                     "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1  # what the kernels are given
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert "tok/s" in captured.err and "drafter ngram" in captured.err


def test_a_two_byte_kv_cache_from_the_command_line_keeps_speculation_exact(tiny_dirs, capsys):
    args = ["generate", "hello hello hello", "--target", str(tiny_dirs["qwen2"]), "--drafter", "ngram", "--k", "3",
            "--max-new-tokens", "12", "--no-chat", "--kv-dtype", "bfloat16"]
    assert main([*args, "--compare", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["compare"]["identical"] is True and len(whole["token_ids"]) == 12
    assert main(args) == 0  # streamed to stdout: the same text
    assert capsys.readouterr().out.strip() == whole["text"].strip()


def test_generate_compare_runs_plain_decoding_too(tiny_dirs, capsys):
    args = ["generate", "hello hello hello", "--target", str(tiny_dirs["qwen2"]), "--drafter", "ngram", "--k", "3",
            "--max-new-tokens", "12", "--no-chat", "--compare"]
    assert main([*args, "--json"]) == 0
    compare = json.loads(capsys.readouterr().out)["compare"]
    assert compare["identical"] is True and compare["plain_tokens_per_second"] > 0
    assert compare["speedup"] == pytest.approx(compare["speculative_tokens_per_second"]
                                               / compare["plain_tokens_per_second"])
    assert main(args) == 0
    assert "output identical to plain decoding" in capsys.readouterr().err


@pytest.mark.parametrize("window", ["context=2", "context=2,start=1"])  # start=N: a one-token first prefill
def test_generate_with_lookup_and_a_windowed_draft_model_streams_what_json_returns(tiny_dirs, capsys, window):
    """The default's shape for the 1.5B (lookup + a draft model reading a window of the context), as a user
    runs it: whole (--json, compared with plain decoding) and streamed, the same text."""
    target = str(tiny_dirs["qwen2"])
    args = ["generate", "the cat sat on the mat, the cat sat on the", "--target", target, "--drafter",
            f"ngram+draft:{target}@weights=float32,{window}", "--max-new-tokens", "24", "--no-chat"]
    assert main([*args, "--compare", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["compare"]["identical"] is True and whole["stats"]["drafted"] > 0
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == whole["text"].strip()


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "hi", "--target", "no-such-model"], "unknown model"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--top-p", "0"], "top_p"),
        (["generate", "hi", "--top-p", "nan"], "top_p"),
        # checked before the model loads: the bad model name is never reached
        (["generate", "hi", "--min-p", "2", "--target", "no-such-model"], "min_p"),
        (["generate", "hi", "--temperature", "1", "--seed", "999999999999999999999999999999"], "seed"),
        (["generate", "bad \udcff bytes", "--no-chat"], "not valid Unicode"),
        (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
        (["generate", "hi", "--k", "0"], "k must be"),
        (["generate", "hi", "--k", "auto:0"], "auto:N"),
        (["generate", "hi", "--k", "auto:x"], "auto:N"),
        (["generate", "hi", "--drafter", "magic"], "unknown drafter"),
        (["generate", "hi", "--dtype", "int3"], "dtype"),
        (["generate", "hi", "--device", "tpu9"], "device"),
        (["generate", "hi", "--weights", "int3"], "unknown weight format"),
        (["generate", "hi", "--kv-dtype", "int8"], "unknown KV cache dtype"),
        (["generate", "hi", "--threads", "0"], "not a number of threads"),
        (["generate", "hi", "--weights", "int8", "--backend", "transformers"], "CPU kernel only"),
        (["generate", "hi", "--drafter", "quant:int5"], "unknown weight format"),
        (["generate", "hi", "--weights", "int4:48"], "int4 group size must be a positive multiple of 32"),
        (["serve", "--k", "0"], "k must be"),
        (["serve", "--port", "70000"], "cannot listen"),
        (["serve", "--max-tokens-cap", "0"], "--max-tokens-cap"),
        (["serve", "--prefill-chunk", "0"], "--prefill-chunk"),
        (["serve", "--max-queue", "-1"], "--max-queue"),
        (["generate", "hi", "--drafter", "recycle@shape=forest"], "shape must be one of"),
        (["generate", "hi", "--drafter", "lookahead:4,3"], "is not W,N,G"),  # before the target loads
        (["generate", "hi", "--drafter", "lookahead:99,3,4"], "1 <= W <= 16"),
        (["generate", "hi", "--drafter", "layerskip:banana"], "cannot read 'banana'"),
        (["analyze", "--alpha", "0.5,2"], "acceptance rates"),
        (["bench", "--acceptance", "match,coupled"], "acceptance must be one of"),
        (["pull", "no-such-model"], "unknown zoo model"),
    ],
)
def test_bad_input_one_line_error(tiny_dirs, args, message, capsys):
    """In this process (what a subprocess adds is checked once below): exit code 2, one line on stderr."""
    if "--target" not in args and args[0] in ("generate", "serve"):
        args = [*args, "--target", str(tiny_dirs["llama"])]
    try:
        code = main(args)
    except SystemExit as exit:  # argparse's refusals
        code = exit.code
    stderr = capsys.readouterr().err
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:") and message in lines[0], stderr


def test_bad_input_from_a_shell_is_one_line_and_no_traceback(tiny_dirs):
    result = run_cli("generate", "bad \udcff bytes", "--no-chat", "--target", str(tiny_dirs["llama"]))
    assert result.returncode == 2 and "not valid Unicode" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_grammar_files_valid_and_hostile(tiny_dirs, tmp_path, capsys):
    """Issue 52: a valid GBNF file was refused ('module' object is not callable); a schema nested 1,000 deep
    was a RecursionError traceback."""
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "yes" | "no"')
    assert main(["generate", "hello", "--target", str(tiny_dirs["llama"]), "--drafter", "ngram", "--no-chat",
                 "--max-new-tokens", "8", "--grammar", str(grammar), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] in ("yes", "no")
    deep = tmp_path / "deep.json"  # written as text: json.dumps itself cannot nest this deep
    deep.write_text('{"type": "object", "properties": {"a": ' * 1000 + '{"type": "object"}' + "}}" * 1000)
    result = run_cli("generate", "hi", "--target", str(tiny_dirs["llama"]), "--json-schema", str(deep))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "nested too deeply" in lines[0], result.stderr


def test_stdin_that_is_not_utf8_gets_one_line(tiny_dirs):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONIOENCODING": "utf-8:strict"}
    result = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "-", "--target", str(tiny_dirs["llama"])],
                            input=b"caf\xe9 \xff", capture_output=True, env=env)
    assert result.returncode == 2 and b"not UTF-8" in result.stderr and b"Traceback" not in result.stderr


def test_prompt_longer_than_context(tmp_path):
    from tiny_models import save_tiny_model

    model = save_tiny_model(tmp_path / "short", "llama", max_position_embeddings=16)
    result = run_cli("generate", "x" * 40, "--target", str(model), "--no-chat")
    assert result.returncode == 2 and "context" in result.stderr and "Traceback" not in result.stderr


def test_models_lists_the_zoo(capsys):
    assert main(["models"]) == 0
    rows = {line.split()[0]: line.split()[1:3] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["smollm2-135m-instruct"] == ["llama", "native"]
    assert rows["gemma3-270m"] == ["gemma3_text", "native"]


@pytest.mark.parametrize("kind", ["phi3", "qwen3_moe", "gpt_oss"])
def test_generate_on_a_phi3_or_mixture_gguf_file_streams_what_json_returns(tmp_path, capsys, kind):
    """The newer architectures as a user runs them: `specdec generate FILE.gguf`, streamed and whole (--json)
    alike; a mixture's stats line says how many experts a verification ran (gpt-oss: MXFP4 experts, past its
    window)."""
    hf = make_hf_model(kind, seed=9, **({"mlp_only_layers": []} if kind == "qwen3_moe" else {}))
    path = write_tiny_gguf(tmp_path / f"{kind}.gguf", hf, {"default": "Q8_0", "_exps.weight": "MXFP4"})
    args = ["generate", "hello hello the world", "--target", str(path), "--drafter", "ngram", "--no-chat",
            "--max-new-tokens", "24"]
    assert main([*args, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["stats"]["new_tokens"] == 24
    assert (whole["stats"]["experts_per_pass"] is not None) == (kind != "phi3")
    assert main(args) == 0
    printed = capsys.readouterr()
    assert printed.out.rstrip("\n") == whole["text"]
    assert ("experts a layer per verification" in printed.err) == (kind != "phi3")
