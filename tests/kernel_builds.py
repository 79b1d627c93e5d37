"""The builds of the CPU kernels this CPU runs, for tests that check they agree bit for bit."""

import pytest

from specdec.kernels import (AMX_CPU_FLAGS, AMX_FLAGS, AVX512_CPU_FLAGS, AVX512_FLAGS, FLAGS, KernelBuildError,
                             build_kernel, cpu_flags)


def every_build() -> tuple:
    """The AVX2 build and the AVX-512 build of the kernels, and the AVX-512 build with AMX tiles where this
    CPU has them and the compiler knows their flags; skips where this CPU cannot run the second."""
    if not AVX512_CPU_FLAGS <= cpu_flags():
        pytest.skip("no AVX512-VNNI on this CPU: only the AVX2 build can run")
    builds = [build_kernel(tuple(FLAGS)), build_kernel(tuple(FLAGS + AVX512_FLAGS))]
    if AMX_CPU_FLAGS <= cpu_flags():
        try:
            builds.append(build_kernel(tuple(FLAGS + AVX512_FLAGS + AMX_FLAGS)))
        except KernelBuildError:  # a compiler without -mamx-int8: the kernels run without tiles, as tested
            pass
    return tuple(builds)
