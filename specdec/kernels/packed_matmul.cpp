// y (T, N) = x (T, K) @ W^T for few activation rows T, with W pre-packed into panels of 16 output
// columns: wp[p][k][j] = W[16 p + j][k] (N padded to 16). Four weight formats:
//   float32: the panels hold W itself;
//   bfloat16 / float16: the panels hold W in two bytes a weight (a bf16 or fp16 checkpoint as stored),
//            widened to float32 in registers: every such value is exactly a float32, so a row's result is
//            bit-identical to the float32 kernel's on the same weights, from half the bytes;
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

#include <vector>

// Rows a block takes at once: 2 accumulators a row + 2 weights + the broadcasts must stay in registers. AVX2
// has 16: 4 rows (5+ spill). With AVX-512 (the AVX-512 build, kernels/build.py) a verification of up to 16
// rows streams each panel once: 8-16 rows take one 512-bit accumulator a row (block_wide), 3-7 rows
// 256-bit blocks in its 32 registers. The FMAs then overlap the weight stream instead of running a second
// pass from L2 after it.
// Above 16 rows (prefill) the product is bound by FMAs, not by the stream, and 8-row blocks ran fastest
// (198-217 GFLOP/s against 166-171 with 12, 161-193 with 4; 8960 x 1536 at 32-1024 rows, the Zen 4).
#if defined(__AVX512VL__)
constexpr int TB_MAX = 16, TB_PREFILL = 8;
#else
constexpr int TB_MAX = 4, TB_PREFILL = 4;
#endif
// With 3+ rows a k step takes long enough that the hardware prefetcher falls behind the panel stream
// (measured: forward over 4 tokens 1.4x -> 1.2x a forward over 1, smollm2); one row needs no help.
constexpr int PREFETCH_MIN_ROWS = 3;
constexpr int64_t PREFETCH_STEPS = 64;  // k steps ahead: 4 KB of a float32 panel

// Two regimes above 2 rows. STREAMED (3-16 rows, a verification: each panel comes from memory once, for one
// row block with AVX-512, for up to four blocks of 3-4 rows with AVX2): the activations are read k-major (xt[k][t]: one short run a k step) instead of one stream
// per row, and weights are prefetched into L2 only. 9 rows of 8960 inputs are 315 KB that every panel
// re-reads; nine interleaved streams, and weights pulled into L1 ahead of use, evicted them and left the
// FMAs waiting (both changes measured faster at 9 rows).
// Prefill (17+ rows) reuses each cached panel for many row blocks, bound by FMAs: row-major, L1 prefetch
// (the L2 hint cost it 8%).
constexpr int STREAMED_MAX_ROWS = 16;

template <bool STREAMED>
static inline void prefetch_weights(const void* at) {
    if constexpr (STREAMED) {
        _mm_prefetch(static_cast<const char*>(at), _MM_HINT_T1);
    } else {
        _mm_prefetch(static_cast<const char*>(at), _MM_HINT_T0);
    }
}

// How each panel format turns its stored values into float32 lanes: `half` 8 of them (AVX2), `whole` 16
// (AVX-512). All but float32 widen in registers: the weights cross memory in their stored size.
struct FromFloat32 {
    using Element = float;
    static inline __m256 half(const float* at) { return _mm256_loadu_ps(at); }
#if defined(__AVX512VL__)
    static inline __m512 whole(const float* at) { return _mm512_loadu_ps(at); }
#endif
};

// int8 codes, sign-extended (vpmovsxbd ymm, m64: no separate load or shift); the scale comes at the end.
struct FromInt8 {
    using Element = int8_t;
    static inline __m256 half(const int8_t* at) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
    }
#if defined(__AVX512VL__)
    static inline __m512 whole(const int8_t* at) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
    }
#endif
};

// bfloat16: a bf16 value is the upper half of the float32 with the same value (zero-extend, shift): exact.
struct FromBf16 {
    using Element = uint16_t;
    static inline __m256 half(const uint16_t* at) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
#if defined(__AVX512VL__)
    static inline __m512 whole(const uint16_t* at) {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
#endif
};

// float16, by the F16C conversion (exact: float32 holds every float16 value).
struct FromFp16 {
    using Element = uint16_t;
    static inline __m256 half(const uint16_t* at) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    }
#if defined(__AVX512VL__)
    static inline __m512 whole(const uint16_t* at) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
    }
#endif
};

// Panels of 16 columns a k step in one of those formats; SCALED: one float scale per output column (int8).
template <typename Format, bool SCALED>
struct WidenedPanels {
    const typename Format::Element* w;
    static constexpr bool scaled = SCALED;
    template <int TB, bool STREAMED>
    inline void load(int64_t p, int64_t K, int64_t k, __m256& w0, __m256& w1) const {
        const auto* at = w + (p * K + k) * 16;
        if (TB >= PREFETCH_MIN_ROWS) prefetch_weights<STREAMED>(at + PREFETCH_STEPS * 16);
        w0 = Format::half(at);
        w1 = Format::half(at + 8);
    }
#if defined(__AVX512VL__)
    inline __m512 load_wide(int64_t p, int64_t K, int64_t k) const {
        const auto* at = w + (p * K + k) * 16;
        prefetch_weights<true>(at + PREFETCH_STEPS * 16);
        return Format::whole(at);
    }
#endif
};

using Float32Panels = WidenedPanels<FromFloat32, false>;
using Int8Panels = WidenedPanels<FromInt8, true>;
using Bf16Panels = WidenedPanels<FromBf16, false>;
using Fp16Panels = WidenedPanels<FromFp16, false>;

// Rows t0..t0+TB-1 times panels p0..p0+PB-1. x: (T, K) row-major; xt (STREAMED with 3+ rows): the same rows
// k-major per row block (rows t0.. at xt + t0 K, element [k][t] at k TB + t).
template <int TB, int PB, bool STREAMED, typename Panels>
static inline void block(const float* x, const float* xt, const Panels& panels, const float* scales, float* y,
                         int64_t K, int64_t N, int64_t p0, int64_t t0) {
    __m256 acc[PB][TB][2];
#pragma GCC unroll 16
    for (int b = 0; b < PB; b++)
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) acc[b][t][0] = acc[b][t][1] = _mm256_setzero_ps();
    const float* xr[TB];
    for (int t = 0; t < TB; t++) xr[t] = x + (t0 + t) * K;
    constexpr bool kmajor = STREAMED && TB >= PREFETCH_MIN_ROWS;
    const float* xk = kmajor ? xt + t0 * K : nullptr;  // k-major: this k step's TB activations side by side
    for (int64_t k = 0; k < K; k++) {
        __m256 xb[TB];
        if constexpr (kmajor) {
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) xb[t] = _mm256_broadcast_ss(xk + t);
            xk += TB;
        } else {
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) xb[t] = _mm256_broadcast_ss(xr[t] + k);
        }
#pragma GCC unroll 16
        for (int b = 0; b < PB; b++) {
            __m256 w0, w1;
            panels.template load<TB, STREAMED>(p0 + b, K, k, w0, w1);
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

#if defined(__AVX512VL__)
// 8-16 rows of a verification in one pass over each panel: one 512-bit accumulator a row (16 columns, one
// FMA and a broadcast a row per k step; 8+ rows are enough independent chains for both FMA pipes), the same
// single FMA chain per output as block's two 256-bit halves (bit-identical), k-major activations; 13-16
// rows take one pass instead of two 256-bit passes.
template <int TB, typename Panels>
static inline void block_wide(const float* xt, const Panels& panels, const float* scales, float* y, int64_t K,
                              int64_t N, int64_t p, int64_t t0) {
    __m512 acc[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) acc[t] = _mm512_setzero_ps();
    const float* xk = xt + t0 * K;
    for (int64_t k = 0; k < K; k++) {
        const __m512 w = panels.load_wide(p, K, k);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_set1_ps(xk[t]), acc[t]);
        xk += TB;
    }
    const int64_t n0 = p * 16;
    const __m512 s = Panels::scaled ? _mm512_loadu_ps(scales + n0) : _mm512_set1_ps(1.0f);
    const __mmask16 mask = n0 + 16 <= N ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) {
        const __m512 r = Panels::scaled ? _mm512_mul_ps(acc[t], s) : acc[t];
        _mm512_mask_storeu_ps(y + (t0 + t) * N + n0, mask, r);
    }
}

template <int TB, typename Panels>
static inline void rows_wide(const float* xt, const Panels& panels, const float* scales, float* y, int64_t K,
                             int64_t N, int64_t p0, int64_t p1, int64_t t0) {
    for (int64_t p = p0; p < p1; p++) block_wide<TB>(xt, panels, scales, y, K, N, p, t0);
}
#endif

// Rows t0.. (TB of them) over panels p0..p1-1, PB panels at a time, single panels for the rest.
template <int TB, int PB, bool STREAMED, typename Panels>
static inline void rows(const float* x, const float* xt, const Panels& panels, const float* scales, float* y,
                        int64_t K, int64_t N, int64_t p0, int64_t p1, int64_t t0) {
    int64_t p = p0;
    for (; p + PB <= p1; p += PB) block<TB, PB, STREAMED>(x, xt, panels, scales, y, K, N, p, t0);
    for (; p < p1; p++) block<TB, 1, STREAMED>(x, xt, panels, scales, y, K, N, p, t0);
}

// One row block of `size` rows (1..TB_MAX) over panels p0..p1-1.
template <bool STREAMED, typename Panels>
static inline void row_block(int64_t size, const float* x, const float* xt, const Panels& panels,
                             const float* scales, float* y, int64_t K, int64_t N, int64_t p0, int64_t p1, int64_t t0) {
#if defined(__AVX512VL__)
    if constexpr (STREAMED) {
        switch (size) {
            case 16: rows_wide<16>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 15: rows_wide<15>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 14: rows_wide<14>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 13: rows_wide<13>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 12: rows_wide<12>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 11: rows_wide<11>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 10: rows_wide<10>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 9: rows_wide<9>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            case 8: rows_wide<8>(xt, panels, scales, y, K, N, p0, p1, t0); return;
            default: break;
        }
    }
#endif
    switch (size) {
#if defined(__AVX512VL__)
        case 8: rows<8, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        case 7: rows<7, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        case 6: rows<6, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        case 5: rows<5, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
#endif
        case 4: rows<4, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        case 3: rows<3, 1, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        case 2: rows<2, 2, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
        default: rows<1, 4, STREAMED>(x, xt, panels, scales, y, K, N, p0, p1, t0); break;
    }
}

template <typename Panels>
static void matmul(const float* x, const Panels& panels, const float* scales, float* y, int64_t T, int64_t K,
                   int64_t N, int num_threads) {
    constexpr int64_t GROUP = 4;  // panels per parallel work item: enough for PB = 4, fine-grained enough
    const int64_t panel_count = (N + 15) / 16;
    const int64_t groups = (panel_count + GROUP - 1) / GROUP;
    // Row blocks of at most `most` rows, as even as possible (5 rows on AVX2: 3 + 2, not 4 + 1: a lone
    // row would be a block of 2 FMA chains, latency-bound); PB panels at once give small blocks 6-8 chains.
    const bool streamed = T <= STREAMED_MAX_ROWS;
    const int64_t most = streamed ? TB_MAX : TB_PREFILL;
    const int64_t blocks = (T + most - 1) / most;
    // A verification's rows in k-major order, copied once (blocks have 3+ rows once T does: as even as possible)
    const bool kmajor = streamed && T >= PREFETCH_MIN_ROWS;
    static thread_local std::vector<float> xt_buffer;  // at most 16 x K floats, kept: no allocation a call
    if (kmajor && xt_buffer.size() < static_cast<size_t>(T * K)) xt_buffer.resize(T * K);
    float* xt = kmajor ? xt_buffer.data() : nullptr;
#pragma omp parallel num_threads(num_threads)
    {
        if (kmajor) {
            for (int64_t i = 0, t0 = 0; i < blocks; i++) {
                const int64_t size = (T - t0) / (blocks - i);
#pragma omp for schedule(static)
                for (int64_t k = 0; k < K; k++)
                    for (int64_t t = 0; t < size; t++) xt[t0 * K + k * size + t] = x[(t0 + t) * K + k];
                t0 += size;  // the loop's implicit barrier: xt is whole before any block reads it
            }
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t p0 = g * GROUP, p1 = p0 + GROUP < panel_count ? p0 + GROUP : panel_count;
            for (int64_t i = 0, t0 = 0; i < blocks; i++) {
                const int64_t size = (T - t0) / (blocks - i);
                if (streamed) {
                    row_block<true>(size, x, xt, panels, scales, y, K, N, p0, p1, t0);
                } else {
                    row_block<false>(size, x, nullptr, panels, scales, y, K, N, p0, p1, t0);
                }
                t0 += size;
            }
        }
    }
}

extern "C" void packed_matmul_f32(const float* x, const float* wp, float* y, int64_t T, int64_t K, int64_t N,
                                  int num_threads) {
    matmul(x, Float32Panels{wp}, nullptr, y, T, K, N, num_threads);
}

// wp: bfloat16 (Bf16Panels) or float16 (Fp16Panels) panels, as uint16_t bits.
extern "C" void packed_matmul_bf16(const float* x, const uint16_t* wp, float* y, int64_t T, int64_t K, int64_t N,
                                   int num_threads) {
    matmul(x, Bf16Panels{wp}, nullptr, y, T, K, N, num_threads);
}

extern "C" void packed_matmul_f16(const float* x, const uint16_t* wp, float* y, int64_t T, int64_t K, int64_t N,
                                  int num_threads) {
    matmul(x, Fp16Panels{wp}, nullptr, y, T, K, N, num_threads);
}

// scales: one per output column, padded to a multiple of 16 like the panels.
extern "C" void packed_matmul_q8(const float* x, const int8_t* wq, const float* scales, float* y, int64_t T,
                                 int64_t K, int64_t N, int num_threads) {
    matmul(x, Int8Panels{wq}, scales, y, T, K, N, num_threads);
}
