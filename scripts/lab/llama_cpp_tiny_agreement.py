"""Greedy tokens against llama.cpp's on tiny files llama.cpp itself wrote: its own converter and quantizer.

    SPECDEC_LLAMA_CPP=LLAMA_CPP_SOURCE python scripts/lab/llama_cpp_tiny_agreement.py [--kinds gpt_oss,qwen3_moe]
        [--tokens 32]

LLAMA_CPP_SOURCE is a llama.cpp source tree built with `cmake -B build -DGGML_NATIVE=ON` (llama-quantize and
libllama.so in build/bin), e.g. llama-cpp-python's sdist's vendor/llama.cpp; its Python bindings (the sdist's
llama_cpp package, which needs `diskcache`) are found beside it. For each kind: the tests' tiny random model
(tests/tiny_models.py) with Qwen2.5's tokenizer (a vocabulary llama.cpp's converter recognizes; from the zoo's
qwen2.5-coder-0.5b-instruct), written by `convert_hf_to_gguf.py --outtype f32`, quantized by `llama-quantize`
(gpt-oss: MXFP4_MOE; others: Q8_0). Then from the same prompt ids, greedy decoding by llama.cpp (its logits
through the bindings) and by us, on the file's blocks (`--weights gguf`) and dequantized (`float32`). Printed:
the tokens that agree before the first difference and, there, the margin between the two tokens in llama.cpp's
logits (a near-tie: both runtimes round activations to 8 bits, at other points and in other orders).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def fibonacci(n):"
QUANTIZE = {"gpt_oss": "MXFP4_MOE"}


def write_file(kind: str, source: Path, work: Path) -> Path:
    """The tiny model of `kind` converted and quantized by llama.cpp's own programs."""
    sys.path.insert(0, str(ROOT / "tests"))
    from transformers import AutoTokenizer

    from specdec.paths import specdec_home
    from tiny_models import make_hf_model

    tokenizer = AutoTokenizer.from_pretrained(str(specdec_home() / "models/qwen2.5-coder-0.5b-instruct/hf"))
    overrides = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None,
                 **{"qwen3_moe": {"mlp_only_layers": []}, "gpt_oss": {"yarn_truncate": True}}.get(kind, {})}
    model_dir, f32, quantized = work / kind, work / f"{kind}-f32.gguf", work / f"{kind}.gguf"
    make_hf_model(kind, seed=7, **overrides).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    env = {**os.environ, "PYTHONPATH": str(source / "gguf-py")}
    subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", "f32",
                    "--outfile", str(f32)], check=True, env=env, capture_output=True)
    subprocess.run([str(source / "build/bin/llama-quantize"), str(f32), str(quantized), QUANTIZE.get(kind, "Q8_0")],
                   check=True, capture_output=True)
    return quantized


def llama_cpp_greedy(path: Path, source: Path, ids: list[int], tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's greedy continuation of `ids` and its logits at each step."""
    os.environ["LLAMA_CPP_LIB_PATH"] = str(source / "build/bin")
    sys.path.insert(0, str(source.parent.parent))  # the sdist's llama_cpp package
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, n_batch=64, logits_all=True, verbose=False)
    llm.eval(ids)
    out, logits = [], []
    for _ in range(tokens):
        row = np.array(llm.scores[llm.n_tokens - 1])
        logits.append(row)
        out.append(int(row.argmax()))
        llm.eval([out[-1]])
    return out, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="gpt_oss,qwen3_moe")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    source = Path(os.environ["SPECDEC_LLAMA_CPP"])
    from specdec.api.generator import SpeculativeGenerator
    from specdec.models.sources.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            path = write_file(kind, source, Path(tmp))
            ids = load_model(str(path), weights="gguf").tokenizer.encode(PROMPT)
            theirs, logits = llama_cpp_greedy(path, source, ids, args.tokens)
            for weights in ("gguf", "float32"):
                ours = SpeculativeGenerator(load_model(str(path), weights=weights), None).generate(
                    PROMPT, args.tokens, chat=False).token_ids
                same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                note = ""
                if same < min(len(ours), len(theirs)):
                    row = logits[same]
                    theirs_logit, ours_logit = row[theirs[same]], row[ours[same]]
                    note = (f"; there llama.cpp's logits {theirs_logit:.4f} (its pick) vs {ours_logit:.4f} (ours), "
                            f"a margin of {theirs_logit - ours_logit:.4f} on a spread of {row.std():.2f}")
                print(f"{kind} ({path.name}, --weights {weights}): {same} of {args.tokens} greedy tokens as "
                      f"llama.cpp's{note}")


if __name__ == "__main__":
    main()
