// y (T, N) = x (T, K) @ W^T for few activation rows T, float32, with W pre-packed
// into panels of 16 output columns: wp[p][k][j] = W[16 p + j][k] (N padded to 16).
//
// Why: stock GEMM re-packs the weight matrix on every call, so a forward over 8
// tokens costs 2-3x a forward over 1 and even one row reads weights at half the
// memory bandwidth. Packing once at load time lets this kernel stream each panel
// contiguously, once per block of up to TB activation rows.
//
// Each output element is a single FMA chain over k in increasing order, whatever
// T is: a row's result does not depend on how many rows share the call, so plain
// and speculative greedy decoding round identically.
#include <immintrin.h>
#include <stdint.h>

#ifndef TB_MAX
#define TB_MAX 6  // 12 accumulators + 2 weight registers of the 16 ymm registers
#endif

template <int TB>
static inline void panel(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t p, int64_t t0) {
    __m256 acc[TB][2];
    for (int t = 0; t < TB; t++) {
        acc[t][0] = _mm256_setzero_ps();
        acc[t][1] = _mm256_setzero_ps();
    }
    const float* w = wp + p * K * 16;
    const float* xr[TB];
    for (int t = 0; t < TB; t++) xr[t] = x + (t0 + t) * K;
    for (int64_t k = 0; k < K; k++) {
        const __m256 w0 = _mm256_loadu_ps(w + k * 16), w1 = _mm256_loadu_ps(w + k * 16 + 8);
        for (int t = 0; t < TB; t++) {
            const __m256 xb = _mm256_broadcast_ss(xr[t] + k);
            acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
        }
    }
    const int64_t n0 = p * 16;
    for (int t = 0; t < TB; t++) {
        float* out = y + (t0 + t) * N + n0;
        if (n0 + 16 <= N) {
            _mm256_storeu_ps(out, acc[t][0]);
            _mm256_storeu_ps(out + 8, acc[t][1]);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc[t][0]);
            _mm256_storeu_ps(tmp + 8, acc[t][1]);
            for (int64_t j = 0; j < N - n0; j++) out[j] = tmp[j];
        }
    }
}

extern "C" void packed_matmul_f32(const float* x, const float* wp, float* y, int64_t T, int64_t K, int64_t N,
                                  int num_threads) {
    const int64_t panels = (N + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t p = 0; p < panels; p++) {
        int64_t t0 = 0;
        for (; t0 + TB_MAX <= T; t0 += TB_MAX) panel<TB_MAX>(x, wp, y, K, N, p, t0);
        switch (T - t0) {
            case 5: panel<5>(x, wp, y, K, N, p, t0); break;
            case 4: panel<4>(x, wp, y, K, N, p, t0); break;
            case 3: panel<3>(x, wp, y, K, N, p, t0); break;
            case 2: panel<2>(x, wp, y, K, N, p, t0); break;
            case 1: panel<1>(x, wp, y, K, N, p, t0); break;
            default: break;
        }
    }
}

// Weight-only int8: wq[p][k][j] = round(W[16 p + j][k] / scale[16 p + j]), |wq| <= 127, one scale per
// output column. The int8 weights are widened to float in registers (never stored as float), the same
// single FMA chain over k runs per output, and the scale is applied once at the end: a quarter of the
// float32 kernel's weight traffic, and the same batch invariance.
template <int TB>
static inline void panel_q8(const float* x, const int8_t* wq, const float* scales, float* y, int64_t K, int64_t N,
                            int64_t p, int64_t t0) {
    __m256 acc[TB][2];
    for (int t = 0; t < TB; t++) {
        acc[t][0] = _mm256_setzero_ps();
        acc[t][1] = _mm256_setzero_ps();
    }
    const int8_t* w = wq + p * K * 16;
    const float* xr[TB];
    for (int t = 0; t < TB; t++) xr[t] = x + (t0 + t) * K;
    for (int64_t k = 0; k < K; k++) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k * 16));
        const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
        for (int t = 0; t < TB; t++) {
            const __m256 xb = _mm256_broadcast_ss(xr[t] + k);
            acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
        }
    }
    const int64_t n0 = p * 16;
    const __m256 s0 = _mm256_loadu_ps(scales + n0), s1 = _mm256_loadu_ps(scales + n0 + 8);
    for (int t = 0; t < TB; t++) {
        float* out = y + (t0 + t) * N + n0;
        const __m256 r0 = _mm256_mul_ps(acc[t][0], s0), r1 = _mm256_mul_ps(acc[t][1], s1);
        if (n0 + 16 <= N) {
            _mm256_storeu_ps(out, r0);
            _mm256_storeu_ps(out + 8, r1);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, r0);
            _mm256_storeu_ps(tmp + 8, r1);
            for (int64_t j = 0; j < N - n0; j++) out[j] = tmp[j];
        }
    }
}

// scales: one per output column, padded to a multiple of 16 like the panels.
extern "C" void packed_matmul_q8(const float* x, const int8_t* wq, const float* scales, float* y, int64_t T,
                                 int64_t K, int64_t N, int num_threads) {
    const int64_t panels = (N + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t p = 0; p < panels; p++) {
        int64_t t0 = 0;
        for (; t0 + TB_MAX <= T; t0 += TB_MAX) panel_q8<TB_MAX>(x, wq, scales, y, K, N, p, t0);
        switch (T - t0) {
            case 5: panel_q8<5>(x, wq, scales, y, K, N, p, t0); break;
            case 4: panel_q8<4>(x, wq, scales, y, K, N, p, t0); break;
            case 3: panel_q8<3>(x, wq, scales, y, K, N, p, t0); break;
            case 2: panel_q8<2>(x, wq, scales, y, K, N, p, t0); break;
            case 1: panel_q8<1>(x, wq, scales, y, K, N, p, t0); break;
            default: break;
        }
    }
}
