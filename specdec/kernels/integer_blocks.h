// The int8 side of the integer kernels, shared by integer_matmul.cpp (our grouped int4/int7) and
// gguf_matmul.cpp (llama.cpp's block formats): activations quantized per block of 32 as Q8_0, and the
// loads of 4-bit and byte weight codes in their column-block layout (integer_matmul.cpp's header comment).
// Included, not compiled on its own.
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "vector_math.h"

namespace integer_blocks {

// The weight codes are one stream per thread, read at 20-30 GB/s a core: too slow a reader for the
// hardware prefetcher to run far enough ahead. Asking for the lines 4 KB ahead took a 1.5B-sized int4
// pass 27 -> 22 ms at one row and 104 -> 82 ms at eight (interleaved A/B over 112 distinct matrices;
// 0.5, 1, 2, 8 and 16 KB measured too, 4 KB best).
constexpr int64_t PREFETCH_BYTES = 4096;
// Which cache the lines go to: vector_math.h's SPECDEC_PREFETCH_HINT.

// Prefetch the cache lines of bytes [at + PREFETCH_BYTES, at + PREFETCH_BYTES + size).
inline void prefetch_ahead(const uint8_t* at, int64_t size) {
    const char* ahead = reinterpret_cast<const char*>(at) + PREFETCH_BYTES;
    for (int64_t line = 0; line < size; line += 64) _mm_prefetch(ahead + line, SPECDEC_PREFETCH_HINT);
}

constexpr int BLOCK = 32;  // inputs per activation block (and the smallest weight group)

// Where the CPU has AVX512-VNNI (with VL: 256-bit forms), the kernels are built with it (kernels/build.py)
// and a block's integer sum can take one vpdpbusd per 32 products instead of vpmaddubsw, vpmaddwd and vpaddd
// (each kernel says where it does).
// Same exact 32-bit sums either way (no product pair here can saturate vpmaddubsw's 16 bits), so both builds
// give bit-identical results (the tests build both where the CPU runs both: tests/kernel_builds.py).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool VNNI = true;
#else
constexpr bool VNNI = false;
#endif

// acc + in each 32-bit lane the sum of its four unsigned(u) x signed(s) byte products.
inline __m256i dot_accumulate(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

inline int32_t horizontal_sum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// xq (T, K) int8, dx (T, K / block), offset (T, K / block) = Z * the block's sum of xq (the zero point's
// share, subtracted from the block's integer sum). One scale per `block` inputs (a multiple of 32): 32 as
// llama.cpp's Q8_0, 256 as its Q8_K (gguf_matmul.cpp's K-quants). Vectorized: at 8 rows this runs once per
// matmul per row and was a tenth of a small matmul as scalar code. Same arithmetic as the scalar form:
// x * (127 / amax), rounded to nearest even (cvtps2dq under the default rounding mode, as nearbyintf).
inline void quantize_rows(const float* x, int64_t T, int64_t K, int32_t zero, int8_t* xq, float* dx, int32_t* offset,
                          int64_t block = BLOCK) {
    const int64_t blocks = K / block;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
    for (int64_t t = 0; t < T; t++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float* in = x + t * K + b * block;
            __m256 amax = _mm256_setzero_ps();
            for (int64_t i = 0; i < block; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(in + i)));
            const float largest = vector_math::lane_max(amax);
            const __m256 inverse = _mm256_set1_ps(largest > 0.0f ? 127.0f / largest : 0.0f);
            __m256i total = _mm256_setzero_si256();
            for (int64_t chunk = 0; chunk < block; chunk += BLOCK) {
                __m256i q[4];
                for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(in + chunk + 8 * i), inverse));
                const __m256i bytes = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), byte_order);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + t * K + b * block + chunk), bytes);
                total = _mm256_add_epi32(total, _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
            }
            dx[t * blocks + b] = largest / 127.0f;
            offset[t * blocks + b] = zero * horizontal_sum(total);
        }
    }
}

// 4-bit weights: one 32-byte load holds 8 inputs of 8 columns; 16-bit partial sums are safe for a whole
// block, as 8 vpmaddubsw of at most 2 * 15 * 127 each stay below 2^15.
struct Nibbles {
    static constexpr int32_t zero = 8;
    static constexpr bool widen_each = false;
    static constexpr int64_t bytes_per_block = BLOCK / 2;
    static inline void load(const uint8_t* at, __m256i& first, __m256i& second) {  // inputs k..k+3, k+4..k+7
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
        const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
        first = _mm256_and_si256(packed, low_nibbles);
        second = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
    }
};

// 7-bit weights: one byte each; one vpmaddubsw (2 * 127 * 127) already fills 15 bits, so each is widened.
struct Bytes {
    static constexpr int32_t zero = 64;
    static constexpr bool widen_each = true;
    static constexpr int64_t bytes_per_block = BLOCK;
    static inline void load(const uint8_t* at, __m256i& first, __m256i& second) {
        first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
        second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32));
    }
};

// The 8 outputs of column block c for rows t0..t0+TB-1 (the last block may hold fewer than 8 columns).
template <int TB>
inline void store_column_block(const __m256 (&acc)[TB], float* y, int64_t N, int64_t c, int64_t t0) {
    const int64_t n0 = c * 8;
#pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        float* out = y + (t0 + t) * N + n0;
        if (n0 + 8 <= N) {
            _mm256_storeu_ps(out, acc[t]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[t]);
            for (int64_t j = 0; j < N - n0; j++) out[j] = tmp[j];
        }
    }
}

// Calls rows_from(std::integral_constant<int, TB>, t0) over row blocks of at most MAX rows covering 0..T-1
// (as even as possible: 9 rows of at most 8 are 5 + 4): each block's row count is a compile-time constant,
// so its accumulators stay in registers, and each block is one pass over the weights.
template <int MAX, typename Block>
inline void rows_of(int64_t rows, int64_t t0, Block&& rows_from) {
    if constexpr (MAX > 1) {
        if (rows < MAX) return rows_of<MAX - 1>(rows, t0, rows_from);
    }
    rows_from(std::integral_constant<int, MAX>{}, t0);
}

template <int MAX = 4, typename Block>
inline void for_row_blocks(int64_t T, Block&& rows_from) {
    const int64_t blocks = (T + MAX - 1) / MAX;
    int64_t t0 = 0;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t rows = (T - t0) / (blocks - b);
        rows_of<MAX>(rows, t0, rows_from);
        t0 += rows;
    }
}

}  // namespace integer_blocks
