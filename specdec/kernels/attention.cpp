// Attention for a few query rows over a KV cache, each row computed exactly as it would be alone.
//
// Row t of T new tokens sees the first `prefix` keys (the committed prefix every row shares) and, of the
// `visible_width` keys after them, those with visible[t][j] (itself, its ancestors in a tree, earlier
// tokens of a chain; the T new keys are the last T). Each row
// takes the same arithmetic in the same order whatever T is and whichever other rows share the call, so
// a verified token's attention output is bit-identical to the one-token step plain decoding takes for it
// (the matmul kernels' rows already are).
//
// Where the time goes at a few hundred keys: one dot product is a chain of D/8 dependent FMAs, so dots
// are taken four keys at a time (four independent chains, each the same chain as alone); exp is the
// vectorized polynomial of vector_math.h; a row's weighted values are summed in registers. Sums over keys
// run in 8 lanes over the keys the row sees, in order (the i-th seen key in lane i % 8), padded to a
// multiple of 8 with zeros: a tree node sees the same keys in the same order as its one-token step, whose
// cache holds exactly them, so it sums the same numbers in the same lanes whatever else shares the call.
//
// q: (H, T, D) contiguous; keys/values: (Hkv, *, D) with `head_stride` floats between heads (the cache's
// layer slice); out: (T, H, D), ready to be flattened to (T, H * D) for the output projection.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <vector>

#include "vector_math.h"

namespace {

using vector_math::exp8;
using vector_math::lane_max;
using vector_math::lane_sum;

// Dot products of q with keys[0..3] (D-vectors): each in 8 lanes of FMAs in k order, then lane_sum.
inline void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3, int64_t D,
                 float* out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 8 <= D; k += 8) {
        const __m256 x = _mm256_loadu_ps(q + k);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + k), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + k), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + k), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + k), a3);
    }
    out[0] = lane_sum(a0), out[1] = lane_sum(a1), out[2] = lane_sum(a2), out[3] = lane_sum(a3);
    for (; k < D; k++) out[0] += q[k] * k0[k], out[1] += q[k] * k1[k], out[2] += q[k] * k2[k], out[3] += q[k] * k3[k];
}

// One dot product: dot4's first chain (the leftover keys of a row round exactly as in a group of four).
inline float dot(const float* q, const float* key, int64_t D) {
    float out[4];
    dot4(q, key, key, key, key, D, out);
    return out[0];
}

// o[0..width) = sum over i in order of p[i] * values[seen[i]][0..width). width <= 64: the sum lives in 8
// registers.
inline void weighted_values(const float* p, const int64_t* seen, int64_t n, const float* values, int64_t D,
                            int64_t width, float* o) {
    constexpr int MAX_REGS = 8;
    const int regs = (int)(width / 8);
    __m256 acc[MAX_REGS];
#pragma GCC unroll 8
    for (int r = 0; r < MAX_REGS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i++) {
        const __m256 weight = _mm256_set1_ps(p[i]);
        const float* value = values + seen[i] * D;
#pragma GCC unroll 8
        for (int r = 0; r < MAX_REGS; r++)
            if (r < regs) acc[r] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * r), acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MAX_REGS; r++)
        if (r < regs) _mm256_storeu_ps(o + 8 * r, acc[r]);
    for (int64_t k = 8 * regs; k < width; k++) {  // D not a multiple of 8
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += p[i] * values[seen[i] * D + k];
        o[k] = sum;
    }
}

}  // namespace

extern "C" void attention_rows(const float* q, const float* keys, const float* values, const uint8_t* visible,
                               float* out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t prefix,
                               int64_t visible_width, int64_t head_stride, float scale, int num_threads) {
    const int64_t S = prefix + visible_width, group = H / Hkv;
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<float> scores((S + 7) / 8 * 8);
        std::vector<int64_t> seen(S);
#pragma omp for schedule(static) collapse(2)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t t = 0; t < T; t++) {
                const float* k_head = keys + (h / group) * head_stride;
                const float* v_head = values + (h / group) * head_stride;
                const float* q_row = q + (h * T + t) * D;
                int64_t n = 0;  // the keys this row sees, in order
                for (int64_t j = 0; j < S; j++)
                    if (j < prefix || visible[t * visible_width + (j - prefix)]) seen[n++] = j;
                const int64_t padded = (n + 7) / 8 * 8;
                int64_t i = 0;
                for (; i + 4 <= n; i += 4) {
                    dot4(q_row, k_head + seen[i] * D, k_head + seen[i + 1] * D, k_head + seen[i + 2] * D,
                         k_head + seen[i + 3] * D, D, scores.data() + i);
                    for (int r = 0; r < 4; r++) scores[i + r] *= scale;
                }
                for (; i < n; i++) scores[i] = dot(q_row, k_head + seen[i] * D, D) * scale;
                for (; i < padded; i++) scores[i] = -INFINITY;
                // softmax: exp(score - max) in 8 lanes; the padding is exactly 0
                __m256 top8 = _mm256_set1_ps(-INFINITY);
                for (i = 0; i < padded; i += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores.data() + i));
                const float top = lane_max(top8);
                const __m256 top_v = _mm256_set1_ps(top), minus_inf = _mm256_set1_ps(-INFINITY);
                __m256 total8 = _mm256_setzero_ps();
                for (i = 0; i < padded; i += 8) {
                    const __m256 x = _mm256_loadu_ps(scores.data() + i);
                    const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(x, top_v)));
                    _mm256_storeu_ps(scores.data() + i, e);
                    total8 = _mm256_add_ps(total8, e);
                }
                const float inverse = 1.0f / lane_sum(total8);
                float* o = out + (t * H + h) * D;
                for (int64_t start = 0; start < D; start += 64) {
                    const int64_t width = D - start < 64 ? D - start : 64;
                    weighted_values(scores.data(), seen.data(), n, v_head + start, D, width, o + start);
                }
                for (int64_t k = 0; k < D; k++) o[k] *= inverse;
            }
        }
    }
}
