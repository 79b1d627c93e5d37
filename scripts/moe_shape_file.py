"""A GGUF file with Qwen3-30B-A3B's per-layer shapes and random weights, a few layers deep: what the speed of a
mixture-of-experts model on this machine can be measured on (the real file, 18.6 GB, is not on the
registry and would not fit a test machine's memory twice).

    python scripts/moe_shape_file.py OUT.gguf [--layers 2] [--experts 128]

Shapes as Qwen3-30B-A3B's config: hidden 2048, 32 query heads and 4 key/value heads of 128, 128 experts of
width 768 of which 8 a token (renormalized), every layer a mixture. Matrices are random blocks of the types a
Q4_K_M file holds (Q4_K; Q6_K for attn_v and ffn_down_exps, as llama.cpp's mix), the router float32, norms 1.
The vocabulary is the tests' tiny byte-level one (263 tokens), so the LM head costs nothing: per-layer costs
are what is measured, and the model's are extrapolated from them (48 layers, plus a 151,936-row head).
Then e.g. `python -m specdec.bench.forward_cost --target OUT.gguf` and
`llama-bench -m OUT.gguf -t 2 -p 1,2,4,8,16 -n 16`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tiny vocabulary, random blocks
from tiny_models import VOCAB, random_k_blocks, write_byte_level_vocab  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERT_WIDTH, USED = 2048, 32, 4, 128, 768, 8


def matrix(name: str, rows: int, cols: int, kind: str, experts: int | None = None) -> np.ndarray:
    """Random blocks of `kind` for a (rows, cols) matrix, or `experts` of them stacked."""
    if experts is None:
        return random_k_blocks(kind, rows, cols, seed=hash(name) % 2**32)
    return np.stack([random_k_blocks(kind, rows, cols, seed=(hash(name) + e) % 2**32) for e in range(experts)])


def main() -> None:
    import gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=128)
    args = parser.parse_args()
    writer = gguf.GGUFWriter(str(args.out), "qwen3moe")
    writer.add_block_count(args.layers)
    writer.add_context_length(40960)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(6144)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(args.experts)
    writer.add_expert_used_count(USED)
    writer.add_expert_feed_forward_length(EXPERT_WIDTH)
    write_byte_level_vocab(writer, VOCAB - 2, VOCAB - 1)
    q4, q6 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    ones = np.ones(HIDDEN, dtype=np.float32)
    writer.add_tensor("token_embd.weight", matrix("embd", VOCAB, HIDDEN, "Q4_K"), raw_dtype=q4)
    writer.add_tensor("output_norm.weight", ones)
    rng = np.random.default_rng(0)
    for layer in range(args.layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.attn_q_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_k_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(f"{prefix}q", HEADS * HEAD_DIM, HIDDEN, "Q4_K"), raw_dtype=q4)
        writer.add_tensor(f"{prefix}.attn_k.weight", matrix(f"{prefix}k", KV_HEADS * HEAD_DIM, HIDDEN, "Q4_K"),
                          raw_dtype=q4)
        writer.add_tensor(f"{prefix}.attn_v.weight", matrix(f"{prefix}v", KV_HEADS * HEAD_DIM, HIDDEN, "Q6_K"),
                          raw_dtype=q6)
        writer.add_tensor(f"{prefix}.attn_output.weight", matrix(f"{prefix}o", HIDDEN, HEADS * HEAD_DIM, "Q4_K"),
                          raw_dtype=q4)
        writer.add_tensor(f"{prefix}.ffn_gate_inp.weight",
                          rng.normal(0, 0.02, (args.experts, HIDDEN)).astype(np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate_exps.weight",
                          matrix(f"{prefix}g", EXPERT_WIDTH, HIDDEN, "Q4_K", args.experts), raw_dtype=q4)
        writer.add_tensor(f"{prefix}.ffn_up_exps.weight",
                          matrix(f"{prefix}u", EXPERT_WIDTH, HIDDEN, "Q4_K", args.experts), raw_dtype=q4)
        writer.add_tensor(f"{prefix}.ffn_down_exps.weight",
                          matrix(f"{prefix}d", HIDDEN, EXPERT_WIDTH, "Q6_K", args.experts), raw_dtype=q6)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MB, {args.layers} layers)")


if __name__ == "__main__":
    main()
