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
// Two rows at a time: consecutive rows of a head mostly see the same keys (a prefill's row t + 1 sees row t's
// keys and one more), so each key and value loaded serves both rows; every row still takes exactly the
// chains and sums above, so pairing changes no bit (tested against one row per call). Only where D is a
// multiple of 8 (every real model's head size): the scalar tails of other sizes may be contracted into
// FMAs differently when inlined into another loop, so those rows go one at a time.
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

// The keys row t sees, in order, into seen; their count.
inline int64_t row_keys(const uint8_t* visible_row, int64_t prefix, int64_t S, int64_t* seen) {
    int64_t n = 0;
    for (int64_t j = 0; j < S; j++)
        if (j < prefix || visible_row[j - prefix]) seen[n++] = j;
    return n;
}

// scores[from..n) = scaled dot products of q with the seen keys from `from` on (dot4 chains, as for one row).
inline void row_scores(const float* q_row, const float* k_head, const int64_t* seen, int64_t from, int64_t n,
                       int64_t D, float scale, float* scores) {
    int64_t i = from;
    for (; i + 4 <= n; i += 4) {
        dot4(q_row, k_head + seen[i] * D, k_head + seen[i + 1] * D, k_head + seen[i + 2] * D,
             k_head + seen[i + 3] * D, D, scores + i);
        for (int r = 0; r < 4; r++) scores[i + r] *= scale;
    }
    for (; i < n; i++) scores[i] = dot(q_row, k_head + seen[i] * D, D) * scale;
}

// scores[0..padded) -> exp(score - max) in 8 lanes (the padding past n exactly 0); 1 / their sum.
inline float softmax_weights(float* scores, int64_t n) {
    const int64_t padded = (n + 7) / 8 * 8;
    for (int64_t i = n; i < padded; i++) scores[i] = -INFINITY;
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < padded; i += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores + i));
    const float top = lane_max(top8);
    const __m256 top_v = _mm256_set1_ps(top), minus_inf = _mm256_set1_ps(-INFINITY);
    __m256 total8 = _mm256_setzero_ps();
    for (int64_t i = 0; i < padded; i += 8) {
        const __m256 x = _mm256_loadu_ps(scores + i);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(x, top_v)));
        _mm256_storeu_ps(scores + i, e);
        total8 = _mm256_add_ps(total8, e);
    }
    return 1.0f / lane_sum(total8);
}

// Two rows' weighted values over a slice of width <= 64 of D, a multiple of 8: rows a and b each sum
// p[i] * values[seen[i]] in order of i, sharing the value loads over the keys both see (the first
// `shared`), then each alone.
inline void weighted_values_pair(const float* pa, const int64_t* seen_a, int64_t na, const float* pb,
                                 const int64_t* seen_b, int64_t nb, int64_t shared, const float* values, int64_t D,
                                 int64_t width, float* oa, float* ob) {
    constexpr int MAX_REGS = 8;
    const int regs = (int)(width / 8);
    __m256 acc_a[MAX_REGS], acc_b[MAX_REGS];
#pragma GCC unroll 8
    for (int r = 0; r < MAX_REGS; r++) acc_a[r] = acc_b[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < shared; i++) {
        const __m256 weight_a = _mm256_set1_ps(pa[i]), weight_b = _mm256_set1_ps(pb[i]);
        const float* value = values + seen_a[i] * D;
#pragma GCC unroll 8
        for (int r = 0; r < MAX_REGS; r++)
            if (r < regs) {
                const __m256 v = _mm256_loadu_ps(value + 8 * r);
                acc_a[r] = _mm256_fmadd_ps(weight_a, v, acc_a[r]);
                acc_b[r] = _mm256_fmadd_ps(weight_b, v, acc_b[r]);
            }
    }
    for (int64_t i = shared; i < na; i++) {
        const __m256 weight = _mm256_set1_ps(pa[i]);
        const float* value = values + seen_a[i] * D;
#pragma GCC unroll 8
        for (int r = 0; r < MAX_REGS; r++)
            if (r < regs) acc_a[r] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * r), acc_a[r]);
    }
    for (int64_t i = shared; i < nb; i++) {
        const __m256 weight = _mm256_set1_ps(pb[i]);
        const float* value = values + seen_b[i] * D;
#pragma GCC unroll 8
        for (int r = 0; r < MAX_REGS; r++)
            if (r < regs) acc_b[r] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * r), acc_b[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MAX_REGS; r++)
        if (r < regs) _mm256_storeu_ps(oa + 8 * r, acc_a[r]), _mm256_storeu_ps(ob + 8 * r, acc_b[r]);
}

// Dot products of two query rows with the same four keys (D a multiple of 8): dot4's chains for each row, the
// keys loaded once.
inline void dot4_pair(const float* qa, const float* qb, const float* k0, const float* k1, const float* k2,
                      const float* k3, int64_t D, float* out_a, float* out_b) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < D; k += 8) {
        const __m256 xa = _mm256_loadu_ps(qa + k), xb = _mm256_loadu_ps(qb + k);
        const __m256 v0 = _mm256_loadu_ps(k0 + k), v1 = _mm256_loadu_ps(k1 + k);
        const __m256 v2 = _mm256_loadu_ps(k2 + k), v3 = _mm256_loadu_ps(k3 + k);
        a0 = _mm256_fmadd_ps(xa, v0, a0), b0 = _mm256_fmadd_ps(xb, v0, b0);
        a1 = _mm256_fmadd_ps(xa, v1, a1), b1 = _mm256_fmadd_ps(xb, v1, b1);
        a2 = _mm256_fmadd_ps(xa, v2, a2), b2 = _mm256_fmadd_ps(xb, v2, b2);
        a3 = _mm256_fmadd_ps(xa, v3, a3), b3 = _mm256_fmadd_ps(xb, v3, b3);
    }
    out_a[0] = lane_sum(a0), out_a[1] = lane_sum(a1), out_a[2] = lane_sum(a2), out_a[3] = lane_sum(a3);
    out_b[0] = lane_sum(b0), out_b[1] = lane_sum(b1), out_b[2] = lane_sum(b2), out_b[3] = lane_sum(b3);
}

}  // namespace

extern "C" void attention_rows(const float* q, const float* keys, const float* values, const uint8_t* visible,
                               float* out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t prefix,
                               int64_t visible_width, int64_t head_stride, float scale, int num_threads) {
    const int64_t S = prefix + visible_width, group = H / Hkv;
    const int64_t step = D % 8 == 0 ? 2 : 1, units = (T + step - 1) / step;  // rows per unit of work: 2 or 1
#pragma omp parallel num_threads(num_threads)
    {
        const int64_t padded_size = (S + 7) / 8 * 8;
        std::vector<float> scores_a(padded_size), scores_b(padded_size);
        std::vector<int64_t> seen_a(S), seen_b(S);
#pragma omp for schedule(static) collapse(2)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t unit = 0; unit < units; unit++) {
                const float* k_head = keys + (h / group) * head_stride;
                const float* v_head = values + (h / group) * head_stride;
                const int64_t ta = step * unit, tb = ta + 1;
                const bool two = step == 2 && tb < T;  // an odd last row goes alone
                const float* qa = q + (h * T + ta) * D;
                const float* qb = two ? qa + D : qa;
                const int64_t na = row_keys(visible + ta * visible_width, prefix, S, seen_a.data());
                const int64_t nb = two ? row_keys(visible + tb * visible_width, prefix, S, seen_b.data()) : 0;
                int64_t shared = 0;  // the keys both rows see, from the first (all of row a's in a chain)
                const int64_t most = na < nb ? na : nb;
                while (shared < most && seen_a[shared] == seen_b[shared]) shared++;
                int64_t i = 0;
                for (; i + 4 <= shared; i += 4) {
                    dot4_pair(qa, qb, k_head + seen_a[i] * D, k_head + seen_a[i + 1] * D, k_head + seen_a[i + 2] * D,
                              k_head + seen_a[i + 3] * D, D, scores_a.data() + i, scores_b.data() + i);
                    for (int r = 0; r < 4; r++) scores_a[i + r] *= scale, scores_b[i + r] *= scale;
                }
                row_scores(qa, k_head, seen_a.data(), i, na, D, scale, scores_a.data());
                if (two) row_scores(qb, k_head, seen_b.data(), i, nb, D, scale, scores_b.data());
                const float inverse_a = softmax_weights(scores_a.data(), na);
                const float inverse_b = two ? softmax_weights(scores_b.data(), nb) : 0.0f;
                float* oa = out + (ta * H + h) * D;
                float* ob = two ? out + (tb * H + h) * D : nullptr;
                for (int64_t start = 0; start < D; start += 64) {
                    const int64_t width = D - start < 64 ? D - start : 64;
                    if (two)
                        weighted_values_pair(scores_a.data(), seen_a.data(), na, scores_b.data(), seen_b.data(), nb,
                                             shared, v_head + start, D, width, oa + start, ob + start);
                    else
                        weighted_values(scores_a.data(), seen_a.data(), na, v_head + start, D, width, oa + start);
                }
                for (int64_t k = 0; k < D; k++) oa[k] *= inverse_a;
                if (two)
                    for (int64_t k = 0; k < D; k++) ob[k] *= inverse_b;
            }
        }
    }
}
