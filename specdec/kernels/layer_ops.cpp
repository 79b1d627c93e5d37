// The small steps of a decoder layer between its matmuls, one call each instead of 5-15 torch operators.
//
// At one or a few rows (decoding, verification) a layer's norms, rope, cache writes and activation cost
// little arithmetic but many operator dispatches: about 40% of a 135M model's step was spent there. Each
// function works row by row with the same arithmetic whatever the row count, so rows stay bit-identical
// to their one-token steps, as the matmul and attention kernels' rows are. Single-threaded: a row is a
// few thousand floats, less than one thread's start costs.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "vector_math.h"

namespace {

using vector_math::exp8;
using vector_math::lane_sum;
using vector_math::store;

// Sum of squares of n floats: 8 lanes in index order, then a fixed horizontal sum.
inline float sum_of_squares(const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float sum = lane_sum(acc);
    for (; i < n; i++) sum += x[i] * x[i];
    return sum;
}

inline void normalize_row(const float* x, const float* weight, float* out, int64_t n, float eps) {
    const float inverse = 1.0f / sqrtf(sum_of_squares(x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inverse);
}

}  // namespace

// out = RMSNorm(x) * weight, rows of n floats. With `residual` (may be null): first sum = x + residual
// (written to `sum`), then out = RMSNorm(sum) * weight: the residual add and the next norm in one pass.
extern "C" void add_rms_norm(const float* x, const float* residual, const float* weight, float* sum, float* out,
                             int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float* row = x + r * n;
        if (residual != nullptr) {
            float* added = sum + r * n;
            for (int64_t i = 0; i < n; i++) added[i] = row[i] + residual[r * n + i];
            row = added;
        }
        normalize_row(row, weight, out + r * n, n, eps);
    }
}

namespace {

// out[0..D) = x rotated by the angles (c, s) in the half-split (rotate_half) layout, stored as OUT elements
// (rounded to them as torch rounds).
template <typename OUT>
inline void rotate_half(const float* x, const float* c, const float* s, int64_t D, OUT* out) {
    const int64_t half = D / 2;
    for (int64_t d = 0; d < half; d++) store(out + d, x[d] * c[d] + (-x[d + half]) * s[d]);
    for (int64_t d = half; d < D; d++) store(out + d, x[d] * c[d] + x[d - half] * s[d]);
}

// rope_qkv_to_cache on a cache of KV elements.
template <typename KV>
void rope_to_cache(const float* qkv, const float* cos, const float* sin, float* q_out, KV* key_cache, KV* value_cache,
                   int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t start, int64_t head_stride) {
    const int64_t width = (H + 2 * Hkv) * D;
    for (int64_t t = 0; t < T; t++) {
        const float* row = qkv + t * width;
        for (int64_t h = 0; h < H; h++) rotate_half(row + h * D, cos + t * D, sin + t * D, D, q_out + (h * T + t) * D);
        for (int64_t h = 0; h < Hkv; h++) {
            KV* slot = key_cache + h * head_stride + (start + t) * D;
            rotate_half(row + (H + h) * D, cos + t * D, sin + t * D, D, slot);
            const float* v = row + (H + Hkv + h) * D;
            KV* value = value_cache + h * head_stride + (start + t) * D;
            for (int64_t d = 0; d < D; d++) store(value + d, v[d]);
        }
    }
}

}  // namespace

// The fused q/k/v projection's rows (T, (H + 2 Hkv) D) -> rotary-embedded queries q_out (H, T, D), and
// rotary-embedded keys and the values written into one layer of the KV cache (float32, bf16 or fp16 elements:
// kv_type) at slots [start, start + T) (head h of the cache at h * head_stride elements). cos/sin: (T, D), the
// half-split (rotate_half) layout.
extern "C" void rope_qkv_to_cache(const float* qkv, const float* cos, const float* sin, float* q_out,
                                  void* key_cache, void* value_cache, int64_t T, int64_t H, int64_t Hkv,
                                  int64_t D, int64_t start, int64_t head_stride, int kv_type) {
    vector_math::with_kv_type(kv_type, [&](auto element) {
        using KV = decltype(element);
        rope_to_cache(qkv, cos, sin, q_out, static_cast<KV*>(key_cache), static_cast<KV*>(value_cache), T, H, Hkv, D,
                      start, head_stride);
    });
}

namespace {

// The fused gate/up projection's rows (T, 2 I) -> f(gate, up) (T, I): `vector` on 8 lanes at a time, `scalar`
// on the columns past the last multiple of 8.
template <typename Vector, typename Scalar>
inline void gated_rows(const float* gate_up, float* out, int64_t T, int64_t I, Vector vector, Scalar scalar) {
    for (int64_t t = 0; t < T; t++) {
        const float* gate = gate_up + t * 2 * I;
        const float* up = gate + I;
        float* y = out + t * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) _mm256_storeu_ps(y + i, vector(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
        for (; i < I; i++) y[i] = scalar(gate[i], up[i]);
    }
}

}  // namespace

// silu(gate) * up.
extern "C" void silu_mul(const float* gate_up, float* out, int64_t T, int64_t I) {
    const __m256 one = _mm256_set1_ps(1.0f);
    gated_rows(
        gate_up, out, T, I,
        [&](__m256 g, __m256 u) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
        },
        [](float g, float u) { return g / (1.0f + expf(-g)) * u; });
}

// gpt-oss's experts: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit).
extern "C" void clamped_swiglu_mul(const float* gate_up, float* out, int64_t T, int64_t I, float limit, float alpha) {
    const __m256 top = _mm256_set1_ps(limit), bottom = _mm256_set1_ps(-limit), one = _mm256_set1_ps(1.0f);
    const __m256 minus_alpha = _mm256_set1_ps(-alpha);
    gated_rows(
        gate_up, out, T, I,
        [&](__m256 gate, __m256 up) {
            const __m256 g = _mm256_min_ps(gate, top), u = _mm256_max_ps(_mm256_min_ps(up, top), bottom);
            const __m256 glu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_mul_ps(minus_alpha, g))));
            return _mm256_mul_ps(_mm256_add_ps(u, one), glu);
        },
        [&](float gate, float up) {
            const float g = fminf(gate, limit), u = fmaxf(fminf(up, limit), -limit);
            return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
        });
}
