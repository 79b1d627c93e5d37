// Attention of a prefill block: T new rows after `start` cached tokens, row t seeing keys [0, start + t]
// (every cached key, and the block's own keys up to itself).
//
// Why not attention.cpp's row kernel: a row there takes the same arithmetic as its one-token step, each
// score a dot product summed in lanes over D and then across the lanes: right for decoding and verification,
// but deep in a long prompt a block's scores are a matrix product, and the lane sums cost as much as the
// products. Here scores run with keys in the lanes (a block's keys transposed once for every query row of
// the group), the softmax runs online over blocks of keys (flash attention: the block's weights, a running
// max and sum, the output rescaled when the max grows), and each key block and value block is read once per
// call for all the query heads of its KV group and all the rows.
//
// Each query row's arithmetic is its own, in an order fixed by the absolute key positions alone:
//   for each block of KEYS keys from key 0 (blocks at multiples of KEYS) up to the block holding its last key:
//     score[j] = (sum over d in order of q[d] * key_j[d], one FMA at a time) * scale, -inf past its last key
//     m' = max(m, the block's largest score);  alpha = exp(m - m')  (0 while m is -inf)
//     w[j] = exp(score[j] - m') (exactly 0 at -inf);  l = l * alpha + lane_sum((w0 + w1) + (w2 + w3))
//     out[c] = out[c] * alpha, then += w[j] * value_j[c] for j in order, one FMA at a time
//   out[c] *= 1 / l
// (wk: the block's weights as 8-lane vectors, keys j = 8k..8k+7). So a row computes the same bits whichever
// rows share its call, whatever T and `start` are (a block past a row's last key, processed because another
// row needs it, leaves it exactly as it was: m unchanged, alpha exp(0) = 1, weights 0): a prompt's keys and
// values do not depend on how its prefill is split. Every operation is on 8 lanes, so the AVX2 and AVX-512
// builds agree bit for bit (AVX-512's 32 registers only take more rows at a time).
// sinks: null, or (H,) logits each head's softmax takes as one more term whose value is zero (gpt-oss): m
// starts at the sink and l at 1 (exp(sink - sink)).
//
// q: (H, T, D) contiguous, D a multiple of 8; keys/values: (Hkv, *, D) of float32, bf16 or fp16 (kv_type:
// vector_math.h's KvType, widened to float32 exactly as they are loaded) with `head_stride` elements between
// heads, the block's own keys and values already written at [start, start + T); out: (T, H, D).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "vector_math.h"

namespace {

using vector_math::exp8;
using vector_math::lane_max;
using vector_math::lane_sum;
using vector_math::load8;

constexpr int64_t KEYS = 32;           // keys a block: transposed keys and values (16 KB each at D = 128) stay in L1
constexpr int KEY_VECTORS = KEYS / 8;  // score accumulators a query row
constexpr int64_t SLICE = 32;          // value columns summed at a time (4 registers a query row)
#ifdef __AVX512VL__
constexpr int ROWS = 6;  // query rows sharing each load: 24 accumulators of the 32 registers
#else
constexpr int ROWS = 2;  // of 16
#endif

// The call, as attention_block receives it; KV: the cache's element type (float, bf16, f16).
template <typename KV>
struct Problem {
    const float* q;
    const KV* keys;
    const KV* values;
    float* out;
    int64_t T, H, Hkv, D, start, head_stride;
    float scale;
    const float* sinks;
    int64_t group() const { return H / Hkv; }
    int64_t keys_seen() const { return start + T; }  // the keys a call reads: [0, start + T)
};

// One query row's running state: its query, its output sums (D floats), the running max and sum.
struct QueryRow {
    const float* q;
    float* out;
    float max, sum;
    int64_t last;  // its last key
};

// keys [first, first + n) of one KV head, widened, as transposed[d][j] (D x KEYS; keys past n are zeros).
template <typename KV>
void transpose_keys(const KV* keys, int64_t first, int64_t n, int64_t D, float* transposed) {
    for (int64_t j = 0; j < KEYS; j++) {
        if (j >= n) {
            for (int64_t d = 0; d < D; d++) transposed[d * KEYS + j] = 0.0f;
            continue;
        }
        const KV* key = keys + (first + j) * D;
        float widened[8];
        for (int64_t d = 0; d < D; d += 8) {
            _mm256_storeu_ps(widened, load8(key + d));
            for (int e = 0; e < 8; e++) transposed[(d + e) * KEYS + j] = widened[e];
        }
    }
}

// R query rows against one key block: their weights into w (R x KEYS) and each row's alpha; the rows' max
// and sum updated (the online softmax above).
template <int R>
void block_weights(QueryRow* rows, const float* transposed, int64_t first, int64_t D, float scale, float* w,
                   float* alpha) {
    __m256 acc[R][KEY_VECTORS];
#pragma GCC unroll 8
    for (int a = 0; a < R; a++)
#pragma GCC unroll 4
        for (int v = 0; v < KEY_VECTORS; v++) acc[a][v] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 k[KEY_VECTORS];
#pragma GCC unroll 4
        for (int v = 0; v < KEY_VECTORS; v++) k[v] = _mm256_loadu_ps(transposed + d * KEYS + 8 * v);
#pragma GCC unroll 8
        for (int a = 0; a < R; a++) {
            const __m256 x = _mm256_broadcast_ss(rows[a].q + d);
#pragma GCC unroll 4
            for (int v = 0; v < KEY_VECTORS; v++) acc[a][v] = _mm256_fmadd_ps(x, k[v], acc[a][v]);
        }
    }
    const __m256 scale8 = _mm256_set1_ps(scale), minus_inf = _mm256_set1_ps(-INFINITY);
    const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
    for (int a = 0; a < R; a++) {
        QueryRow& row = rows[a];
        __m256 top = minus_inf;
#pragma GCC unroll 4
        for (int v = 0; v < KEY_VECTORS; v++) {
            // keys past the row's last get -inf (first + 8v + lane > last, in floats: exact for any cache size here)
            const __m256 beyond = _mm256_cmp_ps(lanes, _mm256_set1_ps((float)(row.last - first - 8 * v)), _CMP_GT_OQ);
            acc[a][v] = _mm256_blendv_ps(_mm256_mul_ps(acc[a][v], scale8), minus_inf, beyond);
            top = _mm256_max_ps(top, acc[a][v]);
        }
        const float largest = std::max(row.max, lane_max(top));
        alpha[a] = row.max == -INFINITY ? 0.0f : _mm256_cvtss_f32(exp8(_mm256_set1_ps(row.max - largest)));
        const __m256 largest8 = _mm256_set1_ps(largest);
        __m256 e[KEY_VECTORS];
#pragma GCC unroll 4
        for (int v = 0; v < KEY_VECTORS; v++) {
            e[v] = _mm256_andnot_ps(_mm256_cmp_ps(acc[a][v], minus_inf, _CMP_EQ_OQ),
                                    exp8(_mm256_sub_ps(acc[a][v], largest8)));
            _mm256_storeu_ps(w + a * KEYS + 8 * v, e[v]);
        }
        static_assert(KEY_VECTORS == 4, "the weights' sum below adds four vectors");
        row.sum = row.sum * alpha[a] + lane_sum(_mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3])));
        row.max = largest;
    }
}

// out[c] = out[c] * alpha + sum over j < n in order of w[j] * value_j[c], for R query rows sharing each
// value's loads, a slice of SLICE columns at a time (D a multiple of 8).
template <int R, typename KV>
void block_values(QueryRow* rows, const float* w, const float* alpha, const KV* values, int64_t n, int64_t D) {
    for (int64_t col = 0; col < D; col += SLICE) {
        const int regs = (int)(std::min(SLICE, D - col) / 8);
        __m256 acc[R][SLICE / 8];
#pragma GCC unroll 8
        for (int a = 0; a < R; a++) {
            const __m256 scale = _mm256_set1_ps(alpha[a]);
#pragma GCC unroll 4
            for (int r = 0; r < SLICE / 8; r++)
                acc[a][r] = r < regs ? _mm256_mul_ps(_mm256_loadu_ps(rows[a].out + col + 8 * r), scale) : _mm256_setzero_ps();
        }
        if (regs == SLICE / 8) {
            for (int64_t j = 0; j < n; j++) {
                const KV* value = values + j * D + col;
                __m256 v[SLICE / 8];
#pragma GCC unroll 4
                for (int r = 0; r < SLICE / 8; r++) v[r] = load8(value + 8 * r);
#pragma GCC unroll 8
                for (int a = 0; a < R; a++) {
                    const __m256 weight = _mm256_broadcast_ss(w + a * KEYS + j);
#pragma GCC unroll 4
                    for (int r = 0; r < SLICE / 8; r++) acc[a][r] = _mm256_fmadd_ps(weight, v[r], acc[a][r]);
                }
            }
        } else {  // a last slice narrower than SLICE (D = 8, 16 or 24 past the last multiple of 32)
            for (int64_t j = 0; j < n; j++)
#pragma GCC unroll 8
                for (int a = 0; a < R; a++)
#pragma GCC unroll 4
                    for (int r = 0; r < SLICE / 8; r++)
                        if (r < regs)
                        acc[a][r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + a * KEYS + j),
                                                    load8(values + j * D + col + 8 * r), acc[a][r]);
        }
#pragma GCC unroll 8
        for (int a = 0; a < R; a++)
#pragma GCC unroll 4
            for (int r = 0; r < SLICE / 8; r++)
                if (r < regs) _mm256_storeu_ps(rows[a].out + col + 8 * r, acc[a][r]);
    }
}

// block_weights then block_values for `count` (1 to ROWS) query rows, as a constant.
template <int R, typename KV>
void tile(int count, QueryRow* rows, const float* transposed, const KV* values, int64_t first, int64_t n,
          int64_t D, float scale, float* w) {
    if constexpr (R > 1) {
        if (count < R) return tile<R - 1>(count, rows, transposed, values, first, n, D, scale, w);
    }
    float alpha[R];
    block_weights<R>(rows, transposed, first, D, scale, w, alpha);
    block_values<R>(rows, w, alpha, values + first * D, n, D);
}

// Query rows [r0, r1) of KV head kv's group (row r: token r / group, head kv * group + r % group), over
// every key block they need.
template <typename KV>
void attend_rows(const Problem<KV>& p, int64_t kv, int64_t r0, int64_t r1) {
    const int64_t G = p.group(), D = p.D;
    const KV* keys = p.keys + kv * p.head_stride;
    const KV* values = p.values + kv * p.head_stride;
    std::vector<float> outs((r1 - r0) * D, 0.0f), transposed(D * KEYS), w(ROWS * KEYS);
    std::vector<QueryRow> rows(r1 - r0);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r / G, h = kv * G + r % G;
        const float sink = p.sinks ? p.sinks[h] : -INFINITY;
        rows[r - r0] = {p.q + (h * p.T + t) * D, outs.data() + (r - r0) * D, sink, p.sinks ? 1.0f : 0.0f,
                        p.start + t};
    }
    const int64_t last = rows.back().last;  // rows go in token order: the last row sees the most keys
    for (int64_t first = 0; first <= last; first += KEYS) {
        const int64_t n = std::min(KEYS, p.keys_seen() - first);
        transpose_keys(keys, first, n, D, transposed.data());
        for (int64_t r = 0; r < r1 - r0; r += ROWS) {
            const int count = (int)std::min<int64_t>(ROWS, r1 - r0 - r);
            if (rows[r + count - 1].last < first) continue;  // none of these rows sees this block
            const int64_t needed = std::min(n, rows[r + count - 1].last - first + 1);  // the values any of them weighs
            tile<ROWS>(count, rows.data() + r, transposed.data(), values, first, needed, D, p.scale, w.data());
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r / G, h = kv * G + r % G;
        const QueryRow& row = rows[r - r0];
        const float inverse = 1.0f / row.sum;
        for (int64_t c = 0; c < D; c++) p.out[(t * p.H + h) * D + c] = row.out[c] * inverse;
    }
}

template <typename KV>
void attend(const Problem<KV>& p, int num_threads) {
    const int64_t rows = p.T * p.group();
    // each KV head's query rows in `parts` runs, as many as makes the units even out over the threads
    int64_t parts = 1;
    while (parts < rows && (p.Hkv * parts) % num_threads != 0) parts++;
#pragma omp parallel for num_threads(num_threads) schedule(static) collapse(2)
    for (int64_t kv = 0; kv < p.Hkv; kv++)
        for (int64_t part = 0; part < parts; part++) {
            const int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
            if (r1 > r0) attend_rows(p, kv, r0, r1);
        }
}

}  // namespace

extern "C" void attention_block(const float* q, const void* keys, const void* values, float* out, int64_t T,
                                int64_t H, int64_t Hkv, int64_t D, int64_t start, int64_t head_stride, float scale,
                                const float* sinks, int kv_type, int num_threads) {
    vector_math::with_kv_type(kv_type, [&](auto element) {
        using KV = decltype(element);
        attend(Problem<KV>{q, static_cast<const KV*>(keys), static_cast<const KV*>(values), out, T, H, Hkv, D, start,
                           head_stride, scale, sinks},
               num_threads);
    });
}
