// Attention for a few query rows over a KV cache, each row computed exactly as it would be alone.
//
// Row t of T new tokens sees the first `prefix` keys (the committed prefix every row shares) and, of the
// `visible_width` keys after them, those with visible[t][j] (itself, its ancestors in a tree, earlier
// tokens of a chain; the T new keys are the last T). Each row takes the same arithmetic in the same order
// whatever T is and whichever other rows share the call, so a verified token's attention output is
// bit-identical to the one-token step plain decoding takes for it (the matmul kernels' rows already are).
//
// A row's arithmetic: each score is one dot product, a chain of FMAs in 8 lanes over D then a fixed lane
// sum (dot4: four independent chains, each the same chain as alone), times the scale; the softmax's max
// and sum run in 8 lanes over the keys the row sees, in order (the i-th seen key in lane i % 8), padded to
// a multiple of 8 with zeros; its output column c is sum over the seen keys in order of p[i] * v[i][c],
// one FMA at a time, then times 1/sum. A tree node sees the same keys in the same order as its one-token
// step, whose cache holds exactly them, so it sums the same numbers in the same lanes.
//
// Where the time goes: deep in a context a pass is the cache's bytes (a decode step of a 1.5B model at 4k
// reads ~235 MB of float32 keys and values). So every key and value is read from memory once per call,
// for all the query heads of its KV group and all the rows: the rows and heads of a group are "query
// rows", and the work goes in three phases, each split across threads without changing any row's
// arithmetic (the order above is per query row; which thread or block computes a term does not matter):
//   1. scores of the keys every row of a chunk sees, a block of keys at a time (kept in L1 while all
//      query rows use it), blocks shared out between threads (flash-decoding's split over the sequence);
//   2. each query row's own remaining keys (a tree's branch, a prefill row's causal tail), then softmax;
//   3. weighted values, a slice of columns per unit of work, a block of keys at a time, the running sums
//      kept in `out` between blocks (a float stored and reloaded is the same float).
// Rows go in chunks so the scores fit a few MB; a chunk's shared keys are the prefix plus the visible
// keys all its rows see (the earlier rows of a prefill), so a causal prefill shares almost every key too.
//
// q: (H, T, D) contiguous; keys/values: (Hkv, *, D) of float32, bf16 or fp16 (kv_type: vector_math.h's
// KvType, widened to float32 exactly as they are loaded) with `head_stride` elements between heads (the
// cache's layer slice); out: (T, H, D), ready to be flattened to (T, H * D) for the output projection.
// sinks: null, or (H,) logits each head's softmax takes as one more term whose value is zero (gpt-oss): the
// max starts from the sink and the sum gains exp(sink - max) after the lane sum; without sinks the max starts
// from -inf and the sum gains exactly 0, the same arithmetic as before sinks existed.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "vector_math.h"

namespace {

using vector_math::exp8;
using vector_math::lane_max;
using vector_math::lane_sum;
using vector_math::load8;
using vector_math::to_float;

constexpr int64_t KEY_BLOCK = 32;         // keys of one block of phase 1 (16 KB at D = 128): stays in L1
constexpr int64_t VALUE_BLOCK = 32;       // keys of one block of phase 3 (16 KB at D = 128): stays in L1
#ifdef __AVX512VL__  // 32 vector registers: larger tiles (the same arithmetic: each row and column alone)
// A whole group of 6 query heads (GQA's usual 12 on 2, or 6 on 1) shares each key's and each value's loads:
// a step's key or value is loaded, and a two-byte one widened, once instead of once per 3 or 4 rows.
constexpr int64_t SLICE = 32;     // value columns of one slice of phase 3 (4 registers a query row)
constexpr int SCORE_ROWS = 6;     // query rows sharing each key's loads in phase 1 (24 accumulators)
constexpr int VALUE_ROWS = 6;     // query rows sharing each value's loads in phase 3 (24 accumulators)
#else
constexpr int VALUE_ROWS = 2;
constexpr int64_t SLICE = 32;
constexpr int SCORE_ROWS = 2;
#endif
// Software prefetches, PREFETCH_KEYS keys ahead in phase 1 and two blocks ahead in phase 3, spread over the
// block's work (asking for a whole block's lines at once streamed slower): with only the hardware's, a
// block's first loads waited on memory while the FMAs of the previous block sat idle.
// Into the cache vector_math.h's SPECDEC_PREFETCH_HINT names (L2 on AMD, as the weight streams).
constexpr int64_t PREFETCH_KEYS = 16;
constexpr int64_t LINE = 64;  // bytes of a cache line
constexpr int64_t ROW_CHUNK = 32;         // rows of one chunk at most: longer prefills share more keys
constexpr int64_t SCORE_BYTES = 8 << 20;  // a chunk's scores at most (unless one row alone needs more)

// The call, as attention_rows receives it; KV: the cache's element type (float, bf16, f16).
template <typename KV>
struct Problem {
    const float* q;
    const KV* keys;
    const KV* values;
    const uint8_t* visible;
    float* out;
    int64_t T, H, Hkv, D, prefix, visible_width, head_stride;
    float scale;
    const float* sinks;  // (H,) or null
    int64_t group() const { return H / Hkv; }
};

// Rows [t0, t1) of the call: each sees keys [0, shared), then its own tail (keys after `shared`, in order).
struct Chunk {
    int64_t t0, t1, shared, padded;  // padded: each query row's score stride
    float* scores;                   // ((t - t0) * H + h) * padded: the scores, then softmax weights
    float* inverse;                  // (t - t0) * H + h: 1 / the weights' sum
    const int64_t* tails;            // (t - t0) * visible_width: the row's keys after `shared`
    const int64_t* tail_sizes;       // (t - t0)
    int64_t rows() const { return t1 - t0; }
};

// Query row r of KV head kv's group within a chunk: rows go head-major within a token.
template <typename P>
inline void query_row(const P& p, const Chunk& c, int64_t kv, int64_t r, int64_t* t, int64_t* h) {
    *t = c.t0 + r / p.group(), *h = kv * p.group() + r % p.group();
}

template <typename P>
inline float* scores_of(const P& p, const Chunk& c, int64_t t, int64_t h) {
    return c.scores + ((t - c.t0) * p.H + h) * c.padded;
}

// The lane sums of four 8-lane vectors, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) each, in one
// vector: vector_math::lane_sum's tree of additions, four at a time (hadd adds neighbouring lanes).
inline __m128 lane_sums4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
}

// lane_sums4 of two rows' four vectors each, in one vector (row a's in the low half): the same additions.
inline __m256 lane_sums4_pair(const __m256* a, const __m256* b) {
    const __m256 pairs_a = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 pairs_b = _mm256_hadd_ps(_mm256_hadd_ps(b[0], b[1]), _mm256_hadd_ps(b[2], b[3]));
    const __m256 lows = _mm256_permute2f128_ps(pairs_a, pairs_b, 0x20);
    return _mm256_add_ps(lows, _mm256_permute2f128_ps(pairs_a, pairs_b, 0x31));
}

// out[0..3] = scale * (the dot products of q with keys k0..k3, D-vectors): each a chain of FMAs in 8 lanes in
// k order, the lane sum, then the columns past the last multiple of 8 one FMA at a time (explicit fmaf:
// inlining cannot round them otherwise), then the scale.
template <typename KV>
inline void dot4(const float* q, const KV* k0, const KV* k1, const KV* k2, const KV* k3, int64_t D, float scale,
                 float* out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 8 <= D; k += 8) {
        const __m256 x = _mm256_loadu_ps(q + k);
        a0 = _mm256_fmadd_ps(x, load8(k0 + k), a0);
        a1 = _mm256_fmadd_ps(x, load8(k1 + k), a1);
        a2 = _mm256_fmadd_ps(x, load8(k2 + k), a2);
        a3 = _mm256_fmadd_ps(x, load8(k3 + k), a3);
    }
    _mm_storeu_ps(out, lane_sums4(a0, a1, a2, a3));
    for (; k < D; k++)
        out[0] = fmaf(q[k], to_float(k0[k]), out[0]), out[1] = fmaf(q[k], to_float(k1[k]), out[1]),
        out[2] = fmaf(q[k], to_float(k2[k]), out[2]), out[3] = fmaf(q[k], to_float(k3[k]), out[3]);
    _mm_storeu_ps(out, _mm_mul_ps(_mm_loadu_ps(out), _mm_set1_ps(scale)));
}

// dot4 for ROWS query rows, each key loaded once for all of them: each row's four chains exactly as dot4's.
template <int ROWS, typename KV>
inline void dot4_rows(const float* const* q, const KV* k0, const KV* k1, const KV* k2, const KV* k3, int64_t D,
                      float scale, float* const* out) {
    __m256 acc[ROWS][4];
    for (int a = 0; a < ROWS; a++) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= D; k += 8) {
        const __m256 v0 = load8(k0 + k), v1 = load8(k1 + k), v2 = load8(k2 + k), v3 = load8(k3 + k);
        for (int a = 0; a < ROWS; a++) {
            const __m256 x = _mm256_loadu_ps(q[a] + k);
            acc[a][0] = _mm256_fmadd_ps(x, v0, acc[a][0]), acc[a][1] = _mm256_fmadd_ps(x, v1, acc[a][1]);
            acc[a][2] = _mm256_fmadd_ps(x, v2, acc[a][2]), acc[a][3] = _mm256_fmadd_ps(x, v3, acc[a][3]);
        }
    }
    if (k == D) {  // no columns past the last multiple of 8 (the head sizes models use): two rows at a time
        const __m256 scale8 = _mm256_set1_ps(scale);
        int a = 0;
        for (; a + 2 <= ROWS; a += 2) {
            const __m256 sums = _mm256_mul_ps(lane_sums4_pair(acc[a], acc[a + 1]), scale8);
            _mm_storeu_ps(out[a], _mm256_castps256_ps128(sums));
            _mm_storeu_ps(out[a + 1], _mm256_extractf128_ps(sums, 1));
        }
        if (a < ROWS)
            _mm_storeu_ps(out[a], _mm_mul_ps(lane_sums4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]),
                                             _mm_set1_ps(scale)));
        return;
    }
    for (int a = 0; a < ROWS; a++) {
        float* o = out[a];
        _mm_storeu_ps(o, lane_sums4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]));
        for (int64_t j = k; j < D; j++)
            o[0] = fmaf(q[a][j], to_float(k0[j]), o[0]), o[1] = fmaf(q[a][j], to_float(k1[j]), o[1]),
            o[2] = fmaf(q[a][j], to_float(k2[j]), o[2]), o[3] = fmaf(q[a][j], to_float(k3[j]), o[3]);
        _mm_storeu_ps(o, _mm_mul_ps(_mm_loadu_ps(o), _mm_set1_ps(scale)));
    }
}

// dot4_rows for `count` (2 to ROWS) query rows, as a constant.
template <int ROWS, typename KV>
inline void dot4_count(int64_t count, const float* const* q, const KV* k0, const KV* k1, const KV* k2, const KV* k3,
                       int64_t D, float scale, float* const* out) {
    if (count == ROWS)
        dot4_rows<ROWS>(q, k0, k1, k2, k3, D, scale, out);
    else if constexpr (ROWS > 2)
        dot4_count<ROWS - 1>(count, q, k0, k1, k2, k3, D, scale, out);
}

// scores[i] for i in [0, n) = scale * q . key(i), key(i) = k_head + index[i] * D (index null: i): dot4 chains.
template <typename KV>
inline void row_scores(const float* q, const KV* k_head, const int64_t* index, int64_t n, int64_t D, float scale,
                       float* scores) {
    auto key = [&](int64_t i) { return k_head + (index ? index[i] : i) * D; };
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        dot4(q, key(i), key(i + 1), key(i + 2), key(i + 3), D, scale, scores + i);
    }
    if (i < n) {  // the last 1-3 keys: a group of four padded with repeats
        float four[4];
        dot4(q, key(i), key(std::min(i + 1, n - 1)), key(std::min(i + 2, n - 1)), key(n - 1), D, scale, four);
        for (int64_t r = 0; i + r < n; r++) scores[i + r] = four[r];
    }
}

// scores[0..padded) -> exp(score - max) in 8 lanes (the padding past n exactly 0); 1 / their sum (plus the
// sink's term: -inf where there is none).
inline float softmax_weights(float* scores, int64_t n, float sink) {
    const int64_t padded = (n + 7) / 8 * 8;
    for (int64_t i = n; i < padded; i++) scores[i] = -INFINITY;
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < padded; i += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores + i));
    const float top = std::max(lane_max(top8), sink);
    const __m256 top_v = _mm256_set1_ps(top), minus_inf = _mm256_set1_ps(-INFINITY);
    __m256 total8 = _mm256_setzero_ps();
    for (int64_t i = 0; i < padded; i += 8) {
        const __m256 x = _mm256_loadu_ps(scores + i);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(x, top_v)));
        _mm256_storeu_ps(scores + i, e);
        total8 = _mm256_add_ps(total8, e);
    }
    return 1.0f / (lane_sum(total8) + expf(sink - top));
}

// o_a[c] += p_a[i] * value(i)[c] for i in [0, n) in order, one FMA at a time, for ROWS (1 to 6) query rows
// sharing each value's loads, over REGS * 8 columns held in registers (REGS a constant, or the compiler keeps
// the sums in memory). value(i) = values + index[i] * D (index null: i).
template <int ROWS, int REGS, typename KV>
inline void accumulate_vectors(float* const* o, const float* const* p, const KV* values, const int64_t* index,
                               int64_t n, int64_t D) {
    __m256 acc[ROWS][REGS];
#pragma GCC unroll 8
    for (int a = 0; a < ROWS; a++)
#pragma GCC unroll 8
        for (int r = 0; r < REGS; r++) acc[a][r] = _mm256_loadu_ps(o[a] + 8 * r);
    for (int64_t i = 0; i < n; i++) {
        const KV* value = values + (index ? index[i] : i) * D;
        __m256 weight[ROWS];
#pragma GCC unroll 8
        for (int a = 0; a < ROWS; a++) weight[a] = _mm256_set1_ps(p[a][i]);
#pragma GCC unroll 8
        for (int r = 0; r < REGS; r++) {
            const __m256 v = load8(value + 8 * r);
#pragma GCC unroll 8
            for (int a = 0; a < ROWS; a++) acc[a][r] = _mm256_fmadd_ps(weight[a], v, acc[a][r]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < ROWS; a++)
#pragma GCC unroll 8
        for (int r = 0; r < REGS; r++) _mm256_storeu_ps(o[a] + 8 * r, acc[a][r]);
}

// accumulate_vectors over `regs` registers (at most REGS), as a constant.
template <int ROWS, int REGS, typename KV>
inline void accumulate_registers(int regs, float* const* o, const float* const* p, const KV* values,
                                 const int64_t* index, int64_t n, int64_t D) {
    if (regs == REGS)
        accumulate_vectors<ROWS, REGS>(o, p, values, index, n, D);
    else if constexpr (REGS > 1)
        accumulate_registers<ROWS, REGS - 1>(regs, o, p, values, index, n, D);
}

// The sums above over `width` columns (at most SLICE), of which the first `vector` (a multiple of 8) in
// registers and the rest (D not a multiple of 8) one FMA at a time (explicit fmaf: the same rounding inlined
// anywhere).
template <int ROWS, typename KV>
inline void accumulate(float* const* o, const float* const* p, const KV* values, const int64_t* index, int64_t n,
                       int64_t D, int64_t vector, int64_t width) {
    if (vector > 0) accumulate_registers<ROWS, SLICE / 8>((int)(vector / 8), o, p, values, index, n, D);
    for (int64_t c = vector; c < width; c++)
        for (int a = 0; a < ROWS; a++) {
            float sum = o[a][c];
            for (int64_t i = 0; i < n; i++) sum = fmaf(p[a][i], to_float(values[(index ? index[i] : i) * D + c]), sum);
            o[a][c] = sum;
        }
}

// Phase 1: scores of shared keys [first, last) for every query row of KV head kv's group in the chunk, SCORE_ROWS
// query rows at a time sharing each key's loads (the leftover rows together too, down to two).
template <typename KV>
void shared_scores(const Problem<KV>& p, const Chunk& c, int64_t kv, int64_t first, int64_t last) {
    const int64_t rows = c.rows() * p.group(), D = p.D;
    const KV* k = p.keys + kv * p.head_stride;
    for (int64_t r = 0; r < rows; r += SCORE_ROWS) {
        const int64_t count = std::min<int64_t>(SCORE_ROWS, rows - r);
        const float* q[SCORE_ROWS];
        float* scores[SCORE_ROWS];
        for (int64_t a = 0; a < count; a++) {
            int64_t t, h;
            query_row(p, c, kv, r + a, &t, &h);
            q[a] = p.q + (h * p.T + t) * D, scores[a] = scores_of(p, c, t, h) + first;
        }
        int64_t j = first;
        for (; count > 1 && j + 4 <= last; j += 4) {
            if (r == 0)  // the first rows stream the block from memory: ask for the keys further on early
                for (int64_t at = 0; at < 4 * D; at += LINE / (int64_t)sizeof(KV))
                    _mm_prefetch((const char*)(k + (j + PREFETCH_KEYS) * D + at), SPECDEC_PREFETCH_HINT);
            const KV *k0 = k + j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
            dot4_count<SCORE_ROWS>(count, q, k0, k1, k2, k3, D, p.scale, scores);
            for (int64_t a = 0; a < count; a++) scores[a] += 4;
        }
        for (int64_t a = 0; a < count; a++) row_scores(q[a], k + j * D, nullptr, last - j, D, p.scale, scores[a]);
    }
}

// Phase 2: query row (t, h)'s tail scores, then its softmax weights and 1 / their sum.
template <typename KV>
void finish_scores(const Problem<KV>& p, const Chunk& c, int64_t t, int64_t h) {
    const int64_t local = t - c.t0, tail = c.tail_sizes[local];
    float* scores = scores_of(p, c, t, h);
    row_scores(p.q + (h * p.T + t) * p.D, p.keys + (h / p.group()) * p.head_stride, c.tails + local * p.visible_width,
               tail, p.D, p.scale, scores + c.shared);
    c.inverse[local * p.H + h] = softmax_weights(scores, c.shared + tail, p.sinks ? p.sinks[h] : -INFINITY);
}

// Phase 3: columns [col, col + width) of every query row of KV head kv's group in the chunk, a block of keys
// at a time (its values' columns stay in L1 while every query row and slice uses them).
template <typename KV>
void weighted_values(const Problem<KV>& p, const Chunk& c, int64_t kv, int64_t col, int64_t width) {
    const int64_t rows = c.rows() * p.group(), D = p.D;
    const KV* v = p.values + kv * p.head_stride;
    auto out_of = [&](int64_t r) {
        int64_t t, h;
        query_row(p, c, kv, r, &t, &h);
        return p.out + (t * p.H + h) * D;
    };
    auto weights_of = [&](int64_t r) {
        int64_t t, h;
        query_row(p, c, kv, r, &t, &h);
        return scores_of(p, c, t, h);
    };
    for (int64_t r = 0; r < rows; r++) std::fill(out_of(r) + col, out_of(r) + col + width, 0.0f);
    for (int64_t first = 0; first < c.shared; first += VALUE_BLOCK) {
        const int64_t n = std::min(VALUE_BLOCK, c.shared - first);
        for (int64_t start = col; start < col + width; start += SLICE) {
            const int64_t slice = std::min(SLICE, col + width - start), vector = slice / 8 * 8;
            const KV* values = v + first * D + start;
            // ask for a later block's values while this one is summed, each slice its share of the keys
            const int64_t slices = (width + SLICE - 1) / SLICE, slice_at = (start - col) / SLICE;
            for (int64_t i = slice_at * n / slices; i < (slice_at + 1) * n / slices; i++)
                for (int64_t at = 0; at < width; at += LINE / (int64_t)sizeof(KV))
                    _mm_prefetch((const char*)(v + (first + 2 * VALUE_BLOCK + i) * D + col + at),
                                 SPECDEC_PREFETCH_HINT);
            auto sum_rows = [&](auto count, int64_t r) {  // `count` query rows from r sharing each value's loads
                constexpr int ROWS = decltype(count)::value;
                float* o[ROWS];
                const float* w[ROWS];
                for (int a = 0; a < ROWS; a++) o[a] = out_of(r + a) + start, w[a] = weights_of(r + a) + first;
                accumulate<ROWS>(o, w, values, nullptr, n, D, vector, slice);
            };
            int64_t r = 0;
            for (; r + VALUE_ROWS <= rows; r += VALUE_ROWS) sum_rows(std::integral_constant<int, VALUE_ROWS>(), r);
            if constexpr (VALUE_ROWS > 3)
                for (; r + 3 <= rows; r += 3) sum_rows(std::integral_constant<int, 3>(), r);
            for (; r + 2 <= rows; r += 2) sum_rows(std::integral_constant<int, 2>(), r);
            if (r < rows) sum_rows(std::integral_constant<int, 1>(), r);
        }
    }
    for (int64_t r = 0; r < rows; r++) {  // each row's own keys, then 1 / sum
        int64_t t, h;
        query_row(p, c, kv, r, &t, &h);
        const int64_t local = t - c.t0;
        const float inverse = c.inverse[local * p.H + h];
        for (int64_t start = col; start < col + width; start += SLICE) {
            const int64_t slice = std::min(SLICE, col + width - start);
            float* o[1] = {out_of(r) + start};
            const float* w[1] = {weights_of(r) + c.shared};
            accumulate<1>(o, w, v + start, c.tails + local * p.visible_width, c.tail_sizes[local], D, slice / 8 * 8,
                          slice);
            for (int64_t k = 0; k < slice; k++) o[0][k] *= inverse;
        }
    }
}

// The chunk's shared keys (the prefix and the visible keys every row sees from the first on) and each row's
// tail after them, into tails / tail_sizes.
template <typename P>
int64_t chunk_tails(const P& p, int64_t t0, int64_t t1, int64_t* tails, int64_t* tail_sizes) {
    int64_t common = p.visible_width;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t* row = p.visible + t * p.visible_width;
        int64_t lead = 0;
        while (lead < common && row[lead]) lead++;
        common = lead;
    }
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t* row = p.visible + t * p.visible_width;
        int64_t* tail = tails + (t - t0) * p.visible_width;
        int64_t n = 0;
        for (int64_t j = common; j < p.visible_width; j++)
            if (row[j]) tail[n++] = p.prefix + j;
        tail_sizes[t - t0] = n;
    }
    return p.prefix + common;
}

// The call on a cache of KV elements (attention_rows below dispatches on its type).
template <typename KV>
void attend(const Problem<KV>& p, int num_threads) {
    const int64_t T = p.T, H = p.H, Hkv = p.Hkv, D = p.D, visible_width = p.visible_width;
    const int64_t padded = (p.prefix + visible_width + 7) / 8 * 8;
    const int64_t by_bytes = SCORE_BYTES / (int64_t)sizeof(float) / (H * padded);
    const int64_t chunk_rows = std::max<int64_t>(1, std::min({T, ROW_CHUNK, by_bytes}));
    static thread_local std::vector<float> scores, inverse;  // the caller's: kept between calls (no page faults)
    scores.resize(chunk_rows * H * padded), inverse.resize(chunk_rows * H);
    float* const score_buffer = scores.data();  // thread_local: the other threads take the caller's by pointer
    float* const inverse_buffer = inverse.data();
    // Phase 3's units: each KV head's columns in `parts` runs of 8, as many units as makes them even out over
    // the threads (a 64-wide head on 3 KV heads and 2 threads: 6 units of 32 columns)
    const int64_t eights = (D + 7) / 8;
    int64_t parts = 1;
    while (parts < eights && (Hkv * parts) % num_threads != 0) parts++;
    const int64_t part_width = (eights + parts - 1) / parts * 8;
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<int64_t> tails(chunk_rows * visible_width), tail_sizes(chunk_rows);  // each thread's copy
        for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
            const int64_t t1 = std::min(T, t0 + chunk_rows);
            const int64_t shared = chunk_tails(p, t0, t1, tails.data(), tail_sizes.data());
            const Chunk c{t0, t1, shared, padded, score_buffer, inverse_buffer, tails.data(), tail_sizes.data()};
            const int64_t key_blocks = (shared + KEY_BLOCK - 1) / KEY_BLOCK;
#pragma omp for schedule(static) collapse(2)
            for (int64_t kv = 0; kv < Hkv; kv++)
                for (int64_t block = 0; block < key_blocks; block++)
                    shared_scores(p, c, kv, block * KEY_BLOCK, std::min(shared, (block + 1) * KEY_BLOCK));
#pragma omp for schedule(static) collapse(2)
            for (int64_t t = t0; t < t1; t++)
                for (int64_t h = 0; h < H; h++) finish_scores(p, c, t, h);
#pragma omp for schedule(static) collapse(2)
            for (int64_t kv = 0; kv < Hkv; kv++)
                for (int64_t part = 0; part < parts; part++)
                    if (part * part_width < D)
                        weighted_values(p, c, kv, part * part_width, std::min(part_width, D - part * part_width));
        }
    }
}

}  // namespace

extern "C" void attention_rows(const float* q, const void* keys, const void* values, const uint8_t* visible,
                               float* out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t prefix,
                               int64_t visible_width, int64_t head_stride, float scale, const float* sinks, int kv_type,
                               int num_threads) {
    if (visible_width < 0) prefix += visible_width, visible_width = 0;  // fewer keys than the prefix: those there
    vector_math::with_kv_type(kv_type, [&](auto element) {
        using KV = decltype(element);
        attend(Problem<KV>{q, static_cast<const KV*>(keys), static_cast<const KV*>(values), visible, out, T, H, Hkv, D,
                           prefix, visible_width, head_stride, scale, sinks},
               num_threads);
    });
}
