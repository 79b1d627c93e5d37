"""Greedy text against llama.cpp's on the same GGUF file: does our decoding of a file's blocks say what
llama.cpp's says?

    SPECDEC_LLAMA_CPP=BIN_DIR python scripts/llama_cpp_agreement.py FILE.gguf... [--prompts 5] [--tokens 64]

For each file and each of the shipped code prompts (chat-formatted by the model's template): our plain greedy
decoding of the file's own blocks (`--weights auto`), and `llama-completion --temp 0` on the same prompt
text. Both round activations to 8 bits before the integer products, but not at the same points nor in the
same order of sums, so a near-tie between two tokens can go either way; from there the texts part. Reported
per file: outputs identical (every token of ours agreeing), and the tokens of ours that agree before the
first difference (the shortest, and the mean over prompts, out of the tokens generated).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def agreeing_tokens(token_ids: list[int], text: str, tokenizer) -> int:
    """How many of our tokens, from the first, decode to a prefix of `text` (an end-of-turn token as nothing)."""
    low, high = 0, len(token_ids)
    while low < high:  # the agreeing prefixes are a prefix-closed set: bisect for the longest
        middle = (low + high + 1) // 2
        if text.startswith(tokenizer.decode(token_ids[:middle], skip_special_tokens=True)):
            low = middle
        else:
            high = middle - 1
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    from specdec.api.generator import SpeculativeGenerator
    from specdec.api.request import GenerationRequest
    from specdec.bench.llama_cpp import LlamaCppMode, LlamaCppPeer
    from specdec.bench.tasks import load_prompts
    from specdec.errors import InvalidParameterError
    from specdec.models.sources.loading import load_model

    try:  # the bench's plain llama.cpp peer: llama-completion from $SPECDEC_LLAMA_CPP or PATH
        peers = {name: LlamaCppPeer(name, LlamaCppMode(), None, threads=2) for name in args.files}
    except InvalidParameterError as error:
        parser.error(str(error))
    prompts = [p.prompt for p in load_prompts(["code"], args.prompts)]
    print("| file | outputs identical | tokens agreeing before the first difference: shortest / mean / of |")
    print("|---|---|---|")
    for name in args.files:
        path = Path(name)
        generator = SpeculativeGenerator(load_model(str(path), weights="auto"), None)
        identical, agreeing, generated = 0, [], []
        for prompt in prompts:
            ours = generator.generate(prompt, args.tokens)
            prompt_text = generator.target.tokenizer.decode(generator.prompt_ids(GenerationRequest(prompt)))
            theirs, _ = peers[name].complete(prompt_text, args.tokens)
            agreeing.append(agreeing_tokens(ours.token_ids, theirs, generator.target.tokenizer))
            generated.append(len(ours.token_ids))
            identical += agreeing[-1] == len(ours.token_ids)
        print(f"| {path.name} | {identical}/{len(prompts)} | {min(agreeing)} / {sum(agreeing) / len(agreeing):.1f} / "
              f"{sum(generated) / len(generated):.0f} |", flush=True)
        del generator


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
