"""A GGUF file with Qwen3-30B-A3B's (or gpt-oss-20b's) per-layer shapes and random weights, a few layers deep:
what the speed of a mixture-of-experts model on this machine can be measured on (the real files, 18.6 and
12.1 GB, are not on the registry and would not fit a test machine's memory twice).

    python scripts/moe_shape_file.py OUT.gguf [--layers 2] [--experts 128] [--shape gpt-oss-20b]

Shapes as Qwen3-30B-A3B's config: hidden 2048, 32 query heads and 4 key/value heads of 128, 128 experts of
width 768 of which 8 a token (renormalized), every layer a mixture. Matrices are random blocks of the types a
Q4_K_M file holds (Q4_K; Q6_K for attn_v and ffn_down_exps, as llama.cpp's mix), the router float32, norms 1.
gpt-oss-20b's (--shape gpt-oss-20b): hidden 2880, 64 query heads and 8 key/value heads of 64 (biased), a
sink per head, 32 experts of width 2880 of which 4 a token, biased; the experts MXFP4 and the rest Q8_0, as
llama.cpp's MXFP4_MOE files hold them; a window of 128 on every other layer, YaRN.
The vocabulary is the tests' tiny byte-level one (263 tokens), so the LM head costs nothing: per-layer costs
are what is measured, and the model's are extrapolated from them (48 layers, plus a 151,936-row head; 24
layers and a 201,088-row head for gpt-oss-20b).
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
OSS_HIDDEN, OSS_HEADS, OSS_KV_HEADS, OSS_HEAD_DIM, OSS_EXPERTS, OSS_USED = 2880, 64, 8, 64, 32, 4


def matrix(name: str, rows: int, cols: int, kind: str, experts: int | None = None) -> np.ndarray:
    """Random blocks of `kind` for a (rows, cols) matrix, or `experts` of them stacked."""
    if experts is None:
        return random_k_blocks(kind, rows, cols, seed=hash(name) % 2**32)
    return np.stack([random_k_blocks(kind, rows, cols, seed=(hash(name) + e) % 2**32) for e in range(experts)])


def mxfp4_blocks(rows: int, cols: int, seed: int, experts: int | None = None) -> np.ndarray:
    """Random MXFP4 blocks (rows, bytes per row), or `experts` of them stacked: random 4-bit indices and scales
    of 2^-10..2^-6 (any bytes are a valid matrix)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (experts or 1, rows, cols // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(118, 123, blocks.shape[:-1], dtype=np.uint8)
    blocks = blocks.reshape(experts or 1, rows, -1)
    return blocks if experts else blocks[0]


def q8_matrix(rows: int, cols: int, seed: int) -> np.ndarray:
    import gguf

    weights = np.random.default_rng(seed).normal(0, 0.02, (rows, cols)).astype(np.float32)
    return gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)


def write_gpt_oss(out: Path, layers: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(out), "gpt-oss")
    writer.add_block_count(layers)
    writer.add_context_length(131072)
    writer.add_embedding_length(OSS_HIDDEN)
    writer.add_feed_forward_length(OSS_HIDDEN)
    writer.add_head_count(OSS_HEADS)
    writer.add_head_count_kv(OSS_KV_HEADS)
    writer.add_key_length(OSS_HEAD_DIM)
    writer.add_value_length(OSS_HEAD_DIM)
    writer.add_rope_dimension_count(OSS_HEAD_DIM)
    writer.add_rope_freq_base(150000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(OSS_EXPERTS)
    writer.add_expert_used_count(OSS_USED)
    writer.add_expert_feed_forward_length(OSS_HIDDEN)
    writer.add_sliding_window(128)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(32.0)
    writer.add_rope_scaling_orig_ctx_len(4096)
    write_byte_level_vocab(writer, VOCAB - 2, VOCAB - 1)
    q8, fp4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    rng = np.random.default_rng(0)
    ones = np.ones(OSS_HIDDEN, dtype=np.float32)

    def small(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.02, shape).astype(np.float32)

    writer.add_tensor("token_embd.weight", q8_matrix(VOCAB, OSS_HIDDEN, 1), raw_dtype=q8)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", q8_matrix(VOCAB, OSS_HIDDEN, 2), raw_dtype=q8)
    queries, keys = OSS_HEADS * OSS_HEAD_DIM, OSS_KV_HEADS * OSS_HEAD_DIM
    for layer in range(layers):
        prefix, seed = f"blk.{layer}", 10 * layer
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.post_attention_norm.weight", ones)
        for name, rows, cols in (("attn_q", queries, OSS_HIDDEN), ("attn_k", keys, OSS_HIDDEN),
                                 ("attn_v", keys, OSS_HIDDEN), ("attn_output", OSS_HIDDEN, queries)):
            seed += 1
            writer.add_tensor(f"{prefix}.{name}.weight", q8_matrix(rows, cols, seed), raw_dtype=q8)
            writer.add_tensor(f"{prefix}.{name}.bias", small(rows))
        writer.add_tensor(f"{prefix}.attn_sinks.weight", small(OSS_HEADS))
        writer.add_tensor(f"{prefix}.ffn_gate_inp.weight", small(OSS_EXPERTS, OSS_HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_gate_inp.bias", small(OSS_EXPERTS))
        for kind in ("gate", "up", "down"):
            seed += 1
            blocks = mxfp4_blocks(OSS_HIDDEN, OSS_HIDDEN, seed, OSS_EXPERTS)
            writer.add_tensor(f"{prefix}.ffn_{kind}_exps.weight", blocks, raw_dtype=fp4)
            writer.add_tensor(f"{prefix}.ffn_{kind}_exps.bias", small(OSS_EXPERTS, OSS_HIDDEN))
    finish(writer, out, layers)


def finish(writer, out: Path, layers: int) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MB, {layers} layers)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=128, help="Qwen3-30B-A3B's shape only")
    parser.add_argument("--shape", choices=("qwen3-30b-a3b", "gpt-oss-20b"), default="qwen3-30b-a3b")
    args = parser.parse_args()
    if args.shape == "gpt-oss-20b":
        write_gpt_oss(args.out, args.layers)
    else:
        write_qwen3_moe(args.out, args.layers, args.experts)


def write_qwen3_moe(out: Path, layers: int, experts: int) -> None:
    import gguf

    args = argparse.Namespace(layers=layers, experts=experts)
    writer = gguf.GGUFWriter(str(out), "qwen3moe")
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
    finish(writer, out, layers)


if __name__ == "__main__":
    main()
