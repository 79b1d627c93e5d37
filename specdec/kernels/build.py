"""Building the CPU kernels and choosing the build the ops call.

The sources in this directory are compiled with the system C++ compiler into $SPECDEC_HOME/kernels the first
time they are needed (a few seconds, then cached by a hash of sources and flags) and loaded through ctypes:
no torch headers, no build step at install. Where there is no compiler, no AVX2/FMA/F16C, or
SPECDEC_NO_KERNELS=1, `packed_kernel()` returns None and models keep stock torch layers.

Each C function is declared once, where its Python wrapper is (ops.py, `declare`: its source file, name
and argument types); the build compiles the declared sources and gives each function its signature.

Which build the ops call is `packed_kernel()`: this CPU's best build by default, or, inside
`with using_kernel(library):`, another one (an A/B of two builds, a variant of the sources built with
`build_kernel(flags, source_dir)`), so tools and tests never patch module globals.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from specdec.paths import specdec_home

KERNEL_DIR = Path(__file__).parent
HEADER_NAMES = ("vector_math.h", "integer_blocks.h")  # included by the sources: part of the build's key
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# Added where the CPU has AVX512-VNNI (Zen 4, Ice Lake and later): the integer kernels' byte dot products
# take one vpdpbusd (integer_blocks.h), and the float32 kernel streams a panel once for up to 16 rows (32
# registers; 512-bit accumulators from 8 rows, packed_matmul.cpp). 256-bit vectors stay preferred elsewhere:
# the other kernels are written for them.
AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mprefer-vector-width=256"]
AVX512_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # /proc/cpuinfo's names for them
# Added to the AVX-512 build where the CPU has AMX (Sapphire Rapids and later): the GGUF kernel's long
# passes (a prompt) take their integer sums from tile products (gguf_matmul.cpp), bit-identical to the
# 512-bit path, which serves where Linux does not grant the tiles.
AMX_FLAGS = ["-mamx-tile", "-mamx-int8"]
AMX_CPU_FLAGS = {"amx_tile", "amx_int8"}


@dataclass(frozen=True)
class KernelFunction:
    """One C function of the kernel library: the source that defines it, its name, its argument types."""

    source: str
    name: str
    argtypes: tuple


DECLARED: dict[str, KernelFunction] = {}  # name -> declaration, filled by `declare` (ops.py)


def declare(source: str, name: str, *argtypes) -> Callable[[], Callable]:
    """Declare a C function of `source` (a file in this directory) taking `argtypes` (ctypes types) and
    returning nothing; the function of the selected build (`packed_kernel()`) that the returned callable
    gives, with that signature set."""
    DECLARED[name] = KernelFunction(source, name, tuple(argtypes))
    return lambda: getattr(packed_kernel(), name)


def source_names() -> tuple[str, ...]:
    """The sources the declared functions live in (what a build compiles), in declaration order."""
    return tuple(dict.fromkeys(function.source for function in DECLARED.values()))


# Added on AMD CPUs: the integer kernels' software prefetches fill L2 rather than L1 (integer_blocks.h).
AMD_FLAGS = ["-DSPECDEC_PREFETCH_TO_L2"]


def cpuinfo_field(name: str) -> str:
    """The first value /proc/cpuinfo gives for `name` on an x86 CPU ('' elsewhere or where it has none)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(name))
    except (OSError, StopIteration):
        return ""
    return line.split(":", 1)[1].strip()


def cpu_vendor() -> str:
    """GenuineIntel, AuthenticAMD, or '' where unknown."""
    return cpuinfo_field("vendor_id")


def cpu_flags() -> set[str]:
    """The x86 feature flags /proc/cpuinfo lists (empty elsewhere)."""
    return set(cpuinfo_field("flags").split())


def cpu_has_avx2_fma_f16c() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def cpu_has_avx512_vnni() -> bool:
    """AVX-512 with VNNI and 256-bit forms (VL); SPECDEC_NO_AVX512=1 builds the AVX2 kernels anyway."""
    return not os.environ.get("SPECDEC_NO_AVX512") and AVX512_CPU_FLAGS <= cpu_flags()


def cpu_has_amx() -> bool:
    """AMX tiles with int8 products; SPECDEC_NO_AMX=1 leaves them out of the build."""
    return not os.environ.get("SPECDEC_NO_AMX") and AMX_CPU_FLAGS <= cpu_flags()


def default_builds() -> list[tuple[str, ...]]:
    """The flags to try on this CPU, best first (none where the kernels cannot run or are switched off)."""
    if os.environ.get("SPECDEC_NO_KERNELS") or not cpu_has_avx2_fma_f16c():
        return []
    base = FLAGS + (AMD_FLAGS if cpu_vendor() == "AuthenticAMD" else [])
    if not cpu_has_avx512_vnni():
        return [tuple(base)]
    return ([tuple(base + AVX512_FLAGS + AMX_FLAGS)] if cpu_has_amx() else []) + [tuple(base + AVX512_FLAGS), tuple(base)]


def choose_build(builds: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The flags of the first of these builds that compiles (a compiler too old for the AVX-512 flags leaves
    the AVX2 build); None without a compiler, or with a one-line warning when none compiles."""
    failure = None
    for flags in builds:
        try:
            build_kernel(tuple(flags))
            return tuple(flags)
        except KernelBuildError as error:
            failure = error
        except FileNotFoundError:  # no compiler
            return None
    if failure is not None:
        print(f"specdec: warning: could not build the CPU kernel, using torch matmul ({failure})", file=sys.stderr)
    return None


def choose_kernel(builds: Sequence[tuple[str, ...]]) -> ctypes.CDLL | None:
    """The library of choose_build's build (built once: build_kernel remembers it), or None."""
    flags = choose_build(builds)
    return None if flags is None else build_kernel(flags)


@functools.cache
def default_build() -> tuple[str, ...] | None:
    """The flags of this CPU's best build that compiles, found once."""
    return choose_build(default_builds())


@functools.cache  # every kernel call asks for it
def default_kernel() -> ctypes.CDLL | None:
    """This CPU's best build, built once."""
    flags = default_build()
    return None if flags is None else build_kernel(flags)


def default_kernel_name() -> str:
    """Which build of the CPU kernels runs here ('AVX-512 VNNI + AMX', 'AVX-512 VNNI', 'AVX2', or "none
    (torch's matmuls)"): the same model runs different code on different CPUs, so a figure says which."""
    flags = set(default_build() or ())
    if not flags:
        return "none (torch's matmuls)"
    if set(AMX_FLAGS) <= flags:
        return "AVX-512 VNNI + AMX"
    return "AVX-512 VNNI" if set(AVX512_FLAGS) <= flags else "AVX2"


_DEFAULT = object()
_selected: list = [_DEFAULT]  # a stack: using_kernel() pushes, leaving pops


def packed_kernel() -> ctypes.CDLL | None:
    """The kernel library the ops call: the innermost `using_kernel` selection, else `default_kernel()`."""
    selected = _selected[-1]
    return default_kernel() if selected is _DEFAULT else selected


@contextlib.contextmanager
def using_kernel(library: ctypes.CDLL | None) -> Iterator[ctypes.CDLL | None]:
    """Run the ops on `library` (a `build_kernel` result; None: torch fallbacks where models check) inside
    the block. Layers that chose their path at load time keep it: load models inside the block to compare
    torch against the kernels."""
    _selected.append(library)
    try:
        yield library
    finally:
        _selected.pop()


class KernelBuildError(RuntimeError):
    """The compiler refused the kernels with these flags (its first lines of complaint)."""


@functools.cache
def build_kernel(flags: tuple[str, ...], source_dir: Path = KERNEL_DIR) -> ctypes.CDLL:
    """The kernel library built with these flags from the sources in `source_dir` (this package's, or a
    variant copy with the same file names), once per flags and sources. Raises FileNotFoundError without a
    C++ compiler, KernelBuildError when the build fails (not cached: tried again if asked)."""
    sources = [source_dir / name for name in source_names()]
    headers = [source_dir / name for name in HEADER_NAMES]
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++ or c++) on the PATH")
    source = b"".join(path.read_bytes() for path in sources + headers)
    key = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    library = specdec_home() / "kernels" / f"packed_matmul-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.partial")
        result = subprocess.run([compiler, *flags, "-o", str(partial), *map(str, sources)], capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise KernelBuildError(result.stderr.strip()[:200])
        partial.rename(library)
    lib = ctypes.CDLL(str(library))
    for function in DECLARED.values():
        entry = getattr(lib, function.name)
        entry.argtypes, entry.restype = list(function.argtypes), None
    return lib
