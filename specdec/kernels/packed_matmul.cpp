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
