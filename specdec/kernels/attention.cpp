// Attention for a few query rows over a KV cache, each row computed exactly as it would be alone.
//
// Row t of T new tokens sees every cached key before them (the committed prefix, `prefix` keys) and the
// new keys j with visible[t][j] (itself, its ancestors in a tree, earlier tokens of a chain). Each row
// takes the same arithmetic in the same order whatever T is and whichever other rows share the call, so
// a verified token's attention output is bit-identical to the one-token step plain decoding takes for it
// (the matmul kernels' rows already are). Rows of one head share each key and value load.
//
// q: (H, T, D) contiguous; keys/values: (Hkv, *, D) with `head_stride` floats between heads (the cache's
// layer slice); out: (T, H, D), ready to be flattened to (T, H * D) for the output projection.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <vector>

namespace {

// Dot product of two D-vectors: 8 lanes of FMAs in k order, then a fixed horizontal sum.
inline float dot(const float* a, const float* b, int64_t D) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= D; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; k < D; k++) sum += a[k] * b[k];
    return sum;
}

}  // namespace

extern "C" void attention_rows(const float* q, const float* keys, const float* values, const uint8_t* visible,
                               float* out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t prefix,
                               int64_t head_stride, float scale, int num_threads) {
    const int64_t S = prefix + T, group = H / Hkv;
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<float> scores(T * S);
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H; h++) {
            const float* k_head = keys + (h / group) * head_stride;
            const float* v_head = values + (h / group) * head_stride;
            const float* q_head = q + h * T * D;
            // scores, key by key: each key is loaded once for all rows that see it
            for (int64_t j = 0; j < S; j++) {
                const float* key = k_head + j * D;
                for (int64_t t = 0; t < T; t++) {
                    const bool seen = j < prefix || visible[t * T + (j - prefix)];
                    scores[t * S + j] = seen ? dot(q_head + t * D, key, D) * scale : -INFINITY;
                }
            }
            // softmax per row, in key order
            std::vector<float> totals(T);
            for (int64_t t = 0; t < T; t++) {
                float* row = scores.data() + t * S;
                float top = -INFINITY;
                for (int64_t j = 0; j < S; j++) top = fmaxf(top, row[j]);
                float total = 0.0f;
                for (int64_t j = 0; j < S; j++) {
                    row[j] = row[j] == -INFINITY ? 0.0f : expf(row[j] - top);
                    total += row[j];
                }
                totals[t] = total;
                float* o = out + (t * H + h) * D;
                for (int64_t k = 0; k < D; k++) o[k] = 0.0f;
            }
            // weighted values, key by key (each row accumulates in key order)
            for (int64_t j = 0; j < S; j++) {
                const float* value = v_head + j * D;
                for (int64_t t = 0; t < T; t++) {
                    const float p = scores[t * S + j];
                    if (p == 0.0f) continue;
                    float* o = out + (t * H + h) * D;
                    const __m256 weight = _mm256_set1_ps(p);
                    int64_t k = 0;
                    for (; k + 8 <= D; k += 8)
                        _mm256_storeu_ps(o + k, _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + k), _mm256_loadu_ps(o + k)));
                    for (; k < D; k++) o[k] += p * value[k];
                }
            }
            for (int64_t t = 0; t < T; t++) {
                float* o = out + (t * H + h) * D;
                const float inverse = 1.0f / totals[t];
                for (int64_t k = 0; k < D; k++) o[k] *= inverse;
            }
        }
    }
}
