"""Quantized linear layers and their storage: packed panels and grouped integer codes on the CPU kernel, a GGUF
file's own blocks, torch's low-bit operators, and the on-disk cache of packed weights."""
