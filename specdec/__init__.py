"""specdec: exact speculative decoding for Llama-family models on CPU and CUDA."""

__version__ = "0.1.0"

from specdec.api.generator import SpeculativeGenerator  # noqa: E402

__all__ = ["SpeculativeGenerator", "__version__"]
