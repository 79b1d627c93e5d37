"""CPU kernels compiled on first use, with a clean fallback.

The packed small-row matmuls (packed_matmul.cpp: float32, bfloat16, float16 and int8 panels; integer_matmul.cpp: grouped
4-bit and 7-bit weights with integer dot products; gguf_matmul.cpp: a GGUF file's own blocks, the same
way), the steps between them (attention.cpp, layer_ops.cpp) and a whole span of decoder layers in one call
(decoder_layers.cpp). Three modules by job:
  build    compiling and loading a build, CPU feature detection, choosing the build the ops call
           (`packed_kernel()`, `using_kernel(library)`);
  layouts  the weight layouts the kernels read and the quantization that fills them;
  ops      the operations on torch tensors.
Everything public is re-exported here.
"""

from specdec.kernels.build import (AMX_CPU_FLAGS, AMX_FLAGS, AVX512_CPU_FLAGS, AVX512_FLAGS, FLAGS, HEADER_NAMES, KERNEL_DIR,  # noqa: F401
                                   KernelBuildError, source_names, build_kernel, choose_kernel, cpu_flags,
                                   cpu_has_amx, cpu_has_avx2_fma_f16c, cpu_has_avx512_vnni, default_builds, default_kernel,
                                   packed_kernel, using_kernel)
from specdec.kernels.layouts import (FLOAT_PANEL_DTYPES, GGUF_LAYOUTS, INTEGER_BLOCK, INTEGER_COLUMNS, PANEL, ZERO_POINTS,  # noqa: F401
                                     dequantize_grouped, grouped_bits, pack_codes, pack_weight,
                                     quantize_grouped, quantize_packed_int8, unpack_codes, unpack_rows)
from specdec.kernels.ops import (SMALL_ROWS, add_rms_norm, attention_block, attention_rows, gguf_matmul,  # noqa: F401
                                 integer_matmul, packed_matmul, packed_matmul_int8, rope_qkv_to_cache, silu_mul)
