"""Both builds of the CPU kernels, for tests that check they agree bit for bit."""

import pytest

from specdec.kernels import AVX512_CPU_FLAGS, AVX512_FLAGS, FLAGS, build_kernel, cpu_flags


def both_builds() -> tuple:
    """The AVX2 build and the AVX-512 build of the kernels; skips where this CPU cannot run the second."""
    if not AVX512_CPU_FLAGS <= cpu_flags():
        pytest.skip("no AVX512-VNNI on this CPU: only the AVX2 build can run")
    return build_kernel(tuple(FLAGS)), build_kernel(tuple(FLAGS + AVX512_FLAGS))
