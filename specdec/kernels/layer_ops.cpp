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

namespace {

// Sum of squares of n floats: 8 lanes in index order, then a fixed horizontal sum.
inline float sum_of_squares(const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; i++) sum += x[i] * x[i];
    return sum;
}

// exp of 8 floats (Cephes' single-precision polynomial, about 1 ulp): glibc's expf does not vectorize
// without -ffast-math, and a 1.5B model's activation takes 8960 of them per row.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n ln 2, in two parts
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));  // times 2^n
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

// The fused q/k/v projection's rows (T, (H + 2 Hkv) D) -> rotary-embedded queries q_out (H, T, D), and
// rotary-embedded keys and the values written into one layer of the KV cache at slots [start, start + T)
// (head h of the cache at h * head_stride floats). cos/sin: (T, D), the half-split (rotate_half) layout.
extern "C" void rope_qkv_to_cache(const float* qkv, const float* cos, const float* sin, float* q_out,
                                  float* key_cache, float* value_cache, int64_t T, int64_t H, int64_t Hkv,
                                  int64_t D, int64_t start, int64_t head_stride) {
    const int64_t half = D / 2, width = (H + 2 * Hkv) * D;
    for (int64_t t = 0; t < T; t++) {
        const float* row = qkv + t * width;
        const float* c = cos + t * D;
        const float* s = sin + t * D;
        for (int64_t h = 0; h < H + Hkv; h++) {
            const float* x = row + h * D;
            float* y = h < H ? q_out + (h * T + t) * D : key_cache + (h - H) * head_stride + (start + t) * D;
            for (int64_t d = 0; d < half; d++) y[d] = x[d] * c[d] + (-x[d + half]) * s[d];
            for (int64_t d = half; d < D; d++) y[d] = x[d] * c[d] + x[d - half] * s[d];
        }
        for (int64_t h = 0; h < Hkv; h++) {
            const float* v = row + (H + Hkv + h) * D;
            float* y = value_cache + h * head_stride + (start + t) * D;
            for (int64_t d = 0; d < D; d++) y[d] = v[d];
        }
    }
}

// The fused gate/up projection's rows (T, 2 I) -> silu(gate) * up (T, I).
extern "C" void silu_mul(const float* gate_up, float* out, int64_t T, int64_t I) {
    for (int64_t t = 0; t < T; t++) {
        const float* gate = gate_up + t * 2 * I;
        const float* up = gate + I;
        float* y = out + t * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
        for (; i < I; i++) y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}
