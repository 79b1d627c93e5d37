// y (T, N) = x (T, K) @ W^T with W in grouped 4-bit or 7-bit form and x quantized to int8 on the fly,
// using integer dot products (vpmaddubsw; vpdpbusd for 7-bit codes where the CPU has AVX512-VNNI) as
// llama.cpp does for Q4_0 x Q8_0.
//
// Why integer arithmetic: widening low-bit weights to float costs as many instructions as the FMAs
// themselves, so a weight-only int8/int4 matmul with float activations is bound by arithmetic on AVX2
// and a forward over 8 tokens costs several forwards over 1. One vpmaddubsw does
// 32 multiply-adds; the weights are read once per call whatever the row count.
//
// Weights: W[n][k] = scale[n][k / G] * (q[n][k] - Z), one float16 scale per output column and group of G
// inputs (G a multiple of 32), stored unsigned (vpmaddubsw's unsigned operand), as column blocks of 8
// outputs, c = n / 8, j = n % 8, so that each 32-bit lane of a vpmaddubsw/vpmaddwd result is a partial
// dot product of one output column (no horizontal sums):
//   4-bit (Z = 8, q in 0..15):   wq[c][k / 8][4 j + i]: low nibble q[n][8 s + i], high nibble q[n][8 s + 4 + i]
//   7-bit (Z = 64, q in 0..127): wq[c][k / 4][4 j + i] = q[n][4 s + i]
//   scales[c][g][j] (float16 bits)
//
// Activations: each row is quantized per block of 32 inputs, xq = round(x * 127 / max|x|) with
// dx = max|x| / 127 (Q8_0), and Z times the block's sum of xq is kept as its offset, so that
//   sum_k (q - Z) xq = sum_k q xq - offset.
// Integer sums are exact; each output then adds dw * dx * isum over blocks in increasing k. Every row is
// quantized and accumulated on its own, so a row's result does not depend on how many rows share the
// call: plain and speculative decoding round identically, at any T (prefill uses this kernel too).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <vector>

#include "integer_blocks.h"

namespace {

using namespace integer_blocks;

// Rows t0..t0+TB-1 times the PB column blocks cs[0..PB-1], each one's sums as if it were alone.
template <int TB, int PB, typename Weights>
inline void column_blocks(const int8_t* xq, const float* dx, const int32_t* offset, const uint8_t* wq,
                          const uint16_t* scales, float* y, int64_t K, int64_t N, int64_t G, const int64_t* cs,
                          int64_t t0) {
    const int64_t blocks = K / BLOCK, per_group = G / BLOCK;
    // vpdpbusd for the 7-bit codes only: the 4-bit codes' 16-bit sums need no vpmaddwd per step, and
    // measured faster than vpdpbusd at 1-2 rows, equal at 8
    constexpr bool vnni = VNNI && Weights::widen_each;
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* w[PB];
    const uint16_t* s[PB];
    __m256 acc[PB][TB];
#pragma GCC unroll 8
    for (int p = 0; p < PB; p++) {
        w[p] = wq + cs[p] * blocks * Weights::bytes_per_block * 8;
        s[p] = scales + cs[p] * (K / G) * 8;
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[p][t] = _mm256_setzero_ps();
    }
    int64_t b = 0;  // block index, walked group by group (no division in the loop)
    for (int64_t g = 0; g < K / G; g++) {
        __m256 dw[PB];
#pragma GCC unroll 8
        for (int p = 0; p < PB; p++) dw[p] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s[p] + g * 8)));
        for (int64_t end = b + per_group; b < end; b++) {
            // sum32 / sum_second: 32-bit sums (two, so that a single row's vpdpbusd chain is half as long)
            __m256i sum16[PB][TB], sum32[PB][TB], sum_second[PB][TB];
#pragma GCC unroll 8
            for (int p = 0; p < PB; p++) {
                prefetch_ahead(w[p] + b * Weights::bytes_per_block * 8, Weights::bytes_per_block * 8);
#pragma GCC unroll 8
                for (int t = 0; t < TB; t++) sum16[p][t] = sum32[p][t] = sum_second[p][t] = _mm256_setzero_si256();
            }
#pragma GCC unroll 1  // unrolled, the compiler hoists every vpmaddubsw and spills the results
            for (int step = 0; step < BLOCK / 8; step++) {
                const int64_t k = b * BLOCK + step * 8;
#pragma GCC unroll 8
                for (int p = 0; p < PB; p++) {
                    __m256i first, second;
                    Weights::load(w[p] + k * Weights::bytes_per_block / BLOCK * 8, first, second);
#pragma GCC unroll 8
                    for (int t = 0; t < TB; t++) {
                        const int8_t* row = xq + (t0 + t) * K + k;
                        const __m256i x0 = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(row));
                        const __m256i x1 = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(row + 4));
                        if (vnni) {
                            sum32[p][t] = dot_accumulate(sum32[p][t], first, x0);
                            sum_second[p][t] = dot_accumulate(sum_second[p][t], second, x1);
                            continue;
                        }
                        const __m256i p0 = _mm256_maddubs_epi16(first, x0);
                        const __m256i p1 = _mm256_maddubs_epi16(second, x1);
                        if (Weights::widen_each) {
                            sum32[p][t] = _mm256_add_epi32(sum32[p][t], _mm256_add_epi32(_mm256_madd_epi16(p0, ones),
                                                                                         _mm256_madd_epi16(p1, ones)));
                        } else {
                            sum16[p][t] = _mm256_add_epi16(_mm256_add_epi16(sum16[p][t], p0), p1);
                        }
                    }
                }
            }
#pragma GCC unroll 8
            for (int p = 0; p < PB; p++) {
#pragma GCC unroll 8
                for (int t = 0; t < TB; t++) {
                    const int64_t at = (t0 + t) * blocks + b;
                    const __m256i total = vnni ? _mm256_add_epi32(sum32[p][t], sum_second[p][t])
                                          : Weights::widen_each ? sum32[p][t] : _mm256_madd_epi16(sum16[p][t], ones);
                    const __m256i exact = _mm256_sub_epi32(total, _mm256_set1_epi32(offset[at]));
                    acc[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(dw[p], _mm256_set1_ps(dx[at])),
                                                acc[p][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < PB; p++) store_column_block<TB>(acc[p], y, N, cs[p], t0);
}

template <typename Weights>
void matmul(const float* x, const uint8_t* wq, const uint16_t* scales, float* y, int64_t T, int64_t K, int64_t N,
            int64_t G, int num_threads) {
    std::vector<int8_t> xq(T * K);
    std::vector<float> dx(T * (K / BLOCK));
    std::vector<int32_t> offset(T * (K / BLOCK));
    quantize_rows(x, T, K, Weights::zero, xq.data(), dx.data(), offset.data());
    const int64_t column_block_count = (N + 7) / 8;
    if (T == 1) {
        // One row (a decode step, a draft step): each thread walks two column blocks half a matrix apart, two
        // weight streams in flight instead of one. The memory system keeps more lines coming (measured on
        // the 1.5B's matrices streaming from memory, 4-bit and 7-bit). Adjacent blocks (one stream, the same
        // independent chains) measured slower: it is the streams, not the chains.
        constexpr int STREAMS = 2;
        const int64_t half = (column_block_count + 1) / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads)
        for (int64_t i = 0; i < half; i++) {
            const int64_t cs[STREAMS] = {i, i + half};
            if (cs[1] < column_block_count) {
                column_blocks<1, STREAMS, Weights>(xq.data(), dx.data(), offset.data(), wq, scales, y, K, N, G, cs, 0);
            } else {
                column_blocks<1, 1, Weights>(xq.data(), dx.data(), offset.data(), wq, scales, y, K, N, G, cs, 0);
            }
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t c = 0; c < column_block_count; c++) {
        for_row_blocks(T, [&](auto rows, int64_t t0) {
            column_blocks<decltype(rows)::value, 1, Weights>(xq.data(), dx.data(), offset.data(), wq, scales, y, K, N, G,
                                                             &c, t0);
        });
    }
}

}  // namespace

extern "C" void int4_matmul(const float* x, const uint8_t* wq, const uint16_t* scales, float* y, int64_t T,
                            int64_t K, int64_t N, int64_t G, int num_threads) {
    matmul<Nibbles>(x, wq, scales, y, T, K, N, G, num_threads);
}

extern "C" void int7_matmul(const float* x, const uint8_t* wq, const uint16_t* scales, float* y, int64_t T,
                            int64_t K, int64_t N, int64_t G, int num_threads) {
    matmul<Bytes>(x, wq, scales, y, T, K, N, G, num_threads);
}
