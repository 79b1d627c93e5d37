"""specdec: exact speculative decoding for Llama-family models on CPU and CUDA."""

__version__ = "0.1.0"

__all__ = ["SpeculativeGenerator", "__version__"]


def __getattr__(name: str):
    # `specdec.SpeculativeGenerator` is imported on first use: the `specdec` command imports this package
    # too, and answers a mistyped option before torch and the runtime load.
    if name == "SpeculativeGenerator":
        from specdec.api.generator import SpeculativeGenerator

        return SpeculativeGenerator
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
