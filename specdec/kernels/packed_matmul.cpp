// y (T, N) = x (T, K) @ W^T for few activation rows T, with W pre-packed into panels of 16 output
// columns: wp[p][k][j] = W[16 p + j][k] (N padded to 16). Two weight formats:
//   float32: the panels hold W itself;
//   int8:    the panels hold round(W / scale) with one float scale per output column, widened to float
//            in registers (never stored as float) and scaled once at the end: a quarter of the traffic.
//
// Why: stock GEMM re-packs the weight matrix on every call, so a forward over 8 tokens costs 2-3x a
// forward over 1 and even one row reads weights at half the memory bandwidth. Packing once at load time
// lets this kernel stream each panel contiguously, once per block of up to TB activation rows.
//
// Each output element is a single FMA chain over k in increasing order, whatever T is: a row's result
// does not depend on how many rows share the call, so plain and speculative greedy decoding round
// identically. With few rows there are too few chains to hide FMA latency, so a block also takes PB
// panels at once (more independent chains, same order within each chain).
//
// The loops over rows and panels carry `#pragma GCC unroll`: without it GCC keeps the accumulator array
// in memory and stores every accumulator on every k step (one 256-bit store per FMA), which held a block
// of 3+ rows to a third of the FMA rate.
#include <immintrin.h>
#include <stdint.h>

// Rows a block takes at once: 2 accumulators a row + 2 weights + the broadcasts must stay in registers. AVX2
// has 16: 4 rows (5+ spill). With AVX-512 (the AVX-512 build, kernels/__init__.py) 256-bit code may use 32,
// and up to 12 rows stream a panel once: at 8-9 rows (a verification) the FMAs then overlap the weight
// stream instead of running a second pass from L2 after it.
// Above 16 rows (prefill) the product is bound by FMAs, not by the stream, and 8-row blocks ran fastest
// (198-217 GFLOP/s against 166-171 with 12, 161-193 with 4; 8960 x 1536 at 32-1024 rows, the Zen 4).
#if defined(__AVX512VL__)
constexpr int TB_MAX = 12, TB_PREFILL = 8;
#else
constexpr int TB_MAX = 4, TB_PREFILL = 4;
#endif
// With 3+ rows a k step takes long enough that the hardware prefetcher falls behind the panel stream
// (measured: forward over 4 tokens 1.4x -> 1.2x a forward over 1, smollm2); one row needs no help.
constexpr int PREFETCH_MIN_ROWS = 3;
constexpr int64_t PREFETCH_STEPS = 64;  // k steps ahead: 4 KB of a float32 panel

struct Float32Panels {
    const float* w;
    static constexpr bool scaled = false;
    template <int TB>
    inline void load(int64_t p, int64_t K, int64_t k, __m256& w0, __m256& w1) const {
        const float* at = w + (p * K + k) * 16;
        if (TB >= PREFETCH_MIN_ROWS) _mm_prefetch(reinterpret_cast<const char*>(at + PREFETCH_STEPS * 16), _MM_HINT_T0);
        w0 = _mm256_loadu_ps(at);
        w1 = _mm256_loadu_ps(at + 8);
    }
};

struct Int8Panels {
    const int8_t* w;
    static constexpr bool scaled = true;
    template <int TB>
    inline void load(int64_t p, int64_t K, int64_t k, __m256& w0, __m256& w1) const {
        // two sign-extending loads (vpmovsxbd ymm, m64): no separate load or shift
        const int8_t* at = w + (p * K + k) * 16;
        if (TB >= PREFETCH_MIN_ROWS) _mm_prefetch(reinterpret_cast<const char*>(at + PREFETCH_STEPS * 16), _MM_HINT_T0);
        w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
        w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at + 8))));
    }
};

// Rows t0..t0+TB-1 times panels p0..p0+PB-1.
template <int TB, int PB, typename Panels>
static inline void block(const float* x, const Panels& panels, const float* scales, float* y, int64_t K, int64_t N,
                         int64_t p0, int64_t t0) {
    __m256 acc[PB][TB][2];
#pragma GCC unroll 16
    for (int b = 0; b < PB; b++)
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) acc[b][t][0] = acc[b][t][1] = _mm256_setzero_ps();
    const float* xr[TB];
    for (int t = 0; t < TB; t++) xr[t] = x + (t0 + t) * K;
    for (int64_t k = 0; k < K; k++) {
        __m256 xb[TB];
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) xb[t] = _mm256_broadcast_ss(xr[t] + k);
#pragma GCC unroll 16
        for (int b = 0; b < PB; b++) {
            __m256 w0, w1;
            panels.template load<TB>(p0 + b, K, k, w0, w1);
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) {
                acc[b][t][0] = _mm256_fmadd_ps(w0, xb[t], acc[b][t][0]);
                acc[b][t][1] = _mm256_fmadd_ps(w1, xb[t], acc[b][t][1]);
            }
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < PB; b++) {
        const int64_t n0 = (p0 + b) * 16;
        __m256 s0 = _mm256_set1_ps(1.0f), s1 = s0;
        if (Panels::scaled) {
            s0 = _mm256_loadu_ps(scales + n0);
            s1 = _mm256_loadu_ps(scales + n0 + 8);
        }
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
            float* out = y + (t0 + t) * N + n0;
            const __m256 r0 = Panels::scaled ? _mm256_mul_ps(acc[b][t][0], s0) : acc[b][t][0];
            const __m256 r1 = Panels::scaled ? _mm256_mul_ps(acc[b][t][1], s1) : acc[b][t][1];
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
}

// Rows t0.. (TB of them) over panels p0..p1-1, PB panels at a time, single panels for the rest.
template <int TB, int PB, typename Panels>
static inline void rows(const float* x, const Panels& panels, const float* scales, float* y, int64_t K, int64_t N,
                        int64_t p0, int64_t p1, int64_t t0) {
    int64_t p = p0;
    for (; p + PB <= p1; p += PB) block<TB, PB>(x, panels, scales, y, K, N, p, t0);
    for (; p < p1; p++) block<TB, 1>(x, panels, scales, y, K, N, p, t0);
}

template <typename Panels>
static void matmul(const float* x, const Panels& panels, const float* scales, float* y, int64_t T, int64_t K,
                   int64_t N, int num_threads) {
    constexpr int64_t GROUP = 4;  // panels per parallel work item: enough for PB = 4, fine-grained enough
    const int64_t panel_count = (N + 15) / 16;
    const int64_t groups = (panel_count + GROUP - 1) / GROUP;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t p0 = g * GROUP, p1 = p0 + GROUP < panel_count ? p0 + GROUP : panel_count;
        // Row blocks of at most `most` rows, as even as possible (5 rows on AVX2: 3 + 2, not 4 + 1: a lone
        // row would be a block of 2 FMA chains, latency-bound); PB panels at once give small blocks 6-8 chains.
        const int64_t most = T > 16 ? TB_PREFILL : TB_MAX;
        const int64_t blocks = (T + most - 1) / most;
        for (int64_t i = 0, t0 = 0; i < blocks; i++) {
            const int64_t size = (T - t0) / (blocks - i);
            switch (size) {
#if defined(__AVX512VL__)
                case 12: rows<12, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 11: rows<11, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 10: rows<10, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 9: rows<9, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 8: rows<8, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 7: rows<7, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 6: rows<6, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 5: rows<5, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
#endif
                case 4: rows<4, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 3: rows<3, 1>(x, panels, scales, y, K, N, p0, p1, t0); break;
                case 2: rows<2, 2>(x, panels, scales, y, K, N, p0, p1, t0); break;
                default: rows<1, 4>(x, panels, scales, y, K, N, p0, p1, t0); break;
            }
            t0 += size;
        }
    }
}

extern "C" void packed_matmul_f32(const float* x, const float* wp, float* y, int64_t T, int64_t K, int64_t N,
                                  int num_threads) {
    matmul(x, Float32Panels{wp}, nullptr, y, T, K, N, num_threads);
}

// scales: one per output column, padded to a multiple of 16 like the panels.
extern "C" void packed_matmul_q8(const float* x, const int8_t* wq, const float* scales, float* y, int64_t T,
                                 int64_t K, int64_t N, int num_threads) {
    matmul(x, Int8Panels{wq}, scales, y, T, K, N, num_threads);
}
