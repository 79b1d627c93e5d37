"""Benchmarks: runtime (forward cost, plain decoding vs transformers) and speculative decoding."""
