// y (T, N) = x (T, K) @ W^T with W in llama.cpp's own block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4),
// repacked at load without changing a single weight value (models/quantized/gguf_blocks.py), and x quantized to
// int8 with one scale dx per super-block (below) of each row: per 32 inputs for the legacy formats (llama.cpp's
// Q8_0), per 256 for the K-quants (its Q8_K), as llama.cpp pairs them.
//
// Every one of those formats is, per output column n and input k,
//   W[n][k] = d[n][k / S] * sc[n][k / G] * q[n][k] + dmin[n][k / S] * mn[n][k / G]
// with integer codes q, 8-bit group codes sc and mn per group of G = 16 or 32 inputs, and float16 d and
// dmin per "super-block" of S = 32 or 256 inputs (Q4_K: sc and mn are its 6-bit scales and mins, dmin its
// negated dmin; Q6_K: G = 16, mn = sc, dmin = -32 d; Q4_0: sc = mn = 1, dmin = -8 d; Q8_0: mn = 0).
// d * sc and dmin * mn are exact in float32 (11-bit times 8-bit mantissas), as llama.cpp computes them.
//
// Codes, in integer_matmul.cpp's column-block layouts:
//   NIBBLES (q in 0..15): its 4-bit layout; int16 partial sums are safe for a whole block of 32
//   CRUMBS  (q in 0..3: Q2_K): per step of 8 inputs x 8 columns, 16 bytes: byte m holds the codes of the
//           step's first[m], first[m + 16], second[m], second[m + 16] (the vectors Nibbles::load makes) in
//           bits 0-1, 2-3, 4-5, 6-7. 2 bits a weight, as in the file (in NIBBLES they would stream twice the
//           bytes); summed as NIBBLES
//   SIXBITS (q in 0..63: Q6_K, Q5_0, and 4-bit codes promoted to share a matrix with them): per step of 8
//           inputs x 8 columns, the 4-bit layout's 32 bytes of low nibbles, then 16 bytes of the codes' top
//           two bits: byte m holds those of the step's first[m], first[m + 16], second[m], second[m + 16]
//           (the vectors Nibbles::load makes) in bits 0-1, 2-3, 4-5, 6-7. 6 bits a weight, as in the file;
//           a step's two products still fit 16 bits (2 x 2 x 63 x 127)
//   SIGNED  (q in -128..127, Q8_0): the byte layout holding signed codes, multiplied as |q| * (sign(q) x)
//           with vpsignb, as llama.cpp does, since vpmaddubsw (and vpdpbusd) need one unsigned operand
//   IQ4     (IQ4_NL, IQ4_XS): the 4-bit layout holding an index into llama.cpp's table of 16 int8 values
//           (kvalues_iq4nl), looked up with vpshufb; then multiplied as SIGNED codes. The 512-bit path,
//           which has no vpsignb, multiplies q + 128 (unsigned) and takes 128 * sum(xq) off each group's
//           integer sum: the same integer as |q| * (sign(q) x), so both paths stay bit-identical
//   FP4     (MXFP4: gpt-oss's experts): as IQ4, with llama.cpp's kvalues_mxfp4 (twice the e2m1 values) as
//           the table
// group_codes[c][g][0..1][8] int8: sc, mn of the 8 columns of column block c; super[c][s][0..1][8]: d, dmin.
// Layouts without a minimum (IQ4, FP4) hold sc and d alone: group_codes[c][g][8], super[c][s][8], 3 bytes a
// block of 32 weights fewer to stream.
//
// Per row: part += (d sc) * sum(q xq) + (dmin mn) * sum(xq) over a super-block's groups (the integer sums
// exact), then acc += dx * part, in increasing k. One activation scale per super-block is what lets the
// float work per group and row shrink to a convert and two FMAs: with 8 rows sharing each weight load those
// compete with the dot products for the same vector pipes. Rows are quantized and accumulated on their own:
// batch-invariant like every kernel here.
#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#include "integer_blocks.h"

namespace {

using namespace integer_blocks;

enum Layout { NIBBLES = 0, SIXBITS = 1, SIGNED = 2, IQ4 = 3, CRUMBS = 4, FP4 = 5 };

// Layouts whose 4-bit codes index a table of 16 int8 values (the i-quants', MXFP4's).
constexpr bool looked_up(int layout) { return layout == IQ4 || layout == FP4; }

constexpr int64_t bytes_per_step(int layout) {
    return layout == SIXBITS ? 48 : layout == SIGNED ? 64 : layout == CRUMBS ? 16 : 32;
}
// The i-quants (IQ4 layout) have no minimum (mn = 0, dmin = 0): its FMA would add exact zeros, so skipping
// it changes no bit. Promoted to SIGNED (fused with other formats) they share their matrix's minimum path.
constexpr bool has_minimum(int layout) { return !looked_up(layout); }
// Layouts whose int16 partial sums hold a whole group (the 256-bit path without VNNI).
constexpr bool small_codes(int layout) { return layout == NIBBLES || layout == CRUMBS; }
// Layouts whose codes are signed bytes once loaded (multiplied with the sign trick).
constexpr bool signed_codes(int layout) { return layout == SIGNED || looked_up(layout); }

// llama.cpp's kvalues_iq4nl: what an IQ4 index stands for (gguf_blocks.IQ4_VALUES), in each 128-bit lane.
// llama.cpp's kvalues_mxfp4 (gguf_blocks.FP4_VALUES) for the FP4 layout.
template <int LAYOUT>
inline __m256i lookup_table() {
    if (LAYOUT == FP4) return _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    return _mm256_broadcastsi128_si256(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
                                                     69, 89, 113));
}

// Eight int8 lanes (one per column of the block) as floats.
inline __m256 int8_lanes(const int8_t* at) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
}

// One step's codes of a column block (8 inputs x 8 columns at `at`): inputs k..k+3 and k+4..k+7 of each
// column, as unsigned bytes (SIGNED: the signed codes; the caller takes their magnitudes).
template <int LAYOUT>
inline void step_codes(const uint8_t* at, __m256i& first, __m256i& second) {
    if (LAYOUT == SIGNED) {
        Bytes::load(at, first, second);
        return;
    }
    if (LAYOUT == CRUMBS) {  // bits 0-1 of each byte: first[m] from pairs >> 0 (low lane) and >> 2 (high lane), ...
        const __m256i pairs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
        const __m256i mask = _mm256_set1_epi8(0x03);
        first = _mm256_and_si256(_mm256_blend_epi32(pairs, _mm256_srli_epi16(pairs, 2), 0xF0), mask);
        second = _mm256_and_si256(_mm256_blend_epi32(_mm256_srli_epi16(pairs, 4), _mm256_srli_epi16(pairs, 6), 0xF0),
                                  mask);
        return;
    }
    Nibbles::load(at, first, second);
    if (looked_up(LAYOUT)) {
        first = _mm256_shuffle_epi8(lookup_table<LAYOUT>(), first);
        second = _mm256_shuffle_epi8(lookup_table<LAYOUT>(), second);
    }
    if (LAYOUT == SIXBITS) {  // put each code's top two bits at bits 4-5 of its byte
        const __m256i top = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 32)));
        const __m256i mask = _mm256_set1_epi8(0x30);
        first = _mm256_or_si256(first, _mm256_and_si256(
            _mm256_blend_epi32(_mm256_slli_epi16(top, 4), _mm256_slli_epi16(top, 2), 0xF0), mask));
        second = _mm256_or_si256(second, _mm256_and_si256(
            _mm256_blend_epi32(top, _mm256_srli_epi16(top, 2), 0xF0), mask));
    }
}

// Where column block c's codes, group codes and super-block scales start.
template <int LAYOUT, int G>
struct ColumnBlock {
    static constexpr int64_t PER_GROUP = has_minimum(LAYOUT) ? 16 : 8;  // group codes (and super scales) a group
    const uint8_t* w;
    const int8_t* gc;
    const uint16_t* sb;
    ColumnBlock(const uint8_t* codes, const int8_t* group_codes, const uint16_t* super, int64_t K, int64_t S, int64_t c)
        : w(codes + c * (K / 8) * bytes_per_step(LAYOUT)), gc(group_codes + c * (K / G) * PER_GROUP),
          sb(super + c * (K / S) * PER_GROUP) {}
    // This group's d * sc and dmin * mn, one lane a column (d and dmin reloaded at each super-block).
    inline void group_scales(int64_t g, int64_t S, __m256& d, __m256& dmin, __m256& scale, __m256& minimum) const {
        const int64_t k0 = g * G;
        if (k0 % S == 0) {
            const uint16_t* at = sb + (k0 / S) * PER_GROUP;
            d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
            if (has_minimum(LAYOUT)) dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 8)));
        }
        scale = _mm256_mul_ps(d, int8_lanes(gc + g * PER_GROUP));
        if (has_minimum(LAYOUT)) minimum = _mm256_mul_ps(dmin, int8_lanes(gc + g * PER_GROUP + 8));
    }
    inline const uint8_t* step(int64_t k) const { return w + (k / 8) * bytes_per_step(LAYOUT); }
};

// Rows t0..t0+TB-1 times column block c; groups of G inputs (16 or 32), super-blocks of S.
template <int TB, int LAYOUT, int G>
inline void column_block(const int8_t* xq, const float* dx, const float* xsum, const uint8_t* codes,
                         const int8_t* group_codes, const uint16_t* super, float* y, int64_t K, int64_t N, int64_t S,
                         int64_t c, int64_t t0) {
    const int64_t groups = K / G;
    const __m256i ones = _mm256_set1_epi16(1);
    const ColumnBlock<LAYOUT, G> block_of(codes, group_codes, super, K, S, c);
    __m256 acc[TB], part[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) acc[t] = part[t] = _mm256_setzero_ps();
    __m256 d = _mm256_setzero_ps(), dmin = d, scale, minimum = d;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * G;
        block_of.group_scales(g, S, d, dmin, scale, minimum);
        prefetch_ahead(block_of.step(k0), G / 8 * bytes_per_step(LAYOUT));
        __m256i sum[TB];
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int step = 0; step < G / 8; step++) {
            const int64_t k = k0 + step * 8;
            __m256i first, second;
            step_codes<LAYOUT>(block_of.step(k), first, second);
            __m256i first_abs = first, second_abs = second;
            if (signed_codes(LAYOUT)) {
                first_abs = _mm256_sign_epi8(first, first);
                second_abs = _mm256_sign_epi8(second, second);
            }
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) {
                const int8_t* row = xq + (t0 + t) * K + k;
                __m256i x0 = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(row));
                __m256i x1 = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(row + 4));
                if (signed_codes(LAYOUT)) {
                    x0 = _mm256_sign_epi8(x0, first);
                    x1 = _mm256_sign_epi8(x1, second);
                }
                if (VNNI) {
                    sum[t] = dot_accumulate(dot_accumulate(sum[t], first_abs, x0), second_abs, x1);
                    continue;
                }
                const __m256i p0 = _mm256_maddubs_epi16(first_abs, x0);
                const __m256i p1 = _mm256_maddubs_epi16(second_abs, x1);
                if (small_codes(LAYOUT)) {
                    sum[t] = _mm256_add_epi16(_mm256_add_epi16(sum[t], p0), p1);
                } else if (LAYOUT == SIXBITS) {  // a step's two products fit 16 bits
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
                } else {
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_add_epi32(_mm256_madd_epi16(p0, ones),
                                                                       _mm256_madd_epi16(p1, ones)));
                }
            }
        }
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
            const __m256i total = !VNNI && small_codes(LAYOUT) ? _mm256_madd_epi16(sum[t], ones) : sum[t];
            part[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, part[t]);
            if (has_minimum(LAYOUT)) part[t] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(xsum[(t0 + t) * groups + g]), part[t]);
        }
        if ((k0 + G) % S == 0) {  // the super-block's end: times the rows' activation scales
            const int64_t s = k0 / S;
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) {
                acc[t] = _mm256_fmadd_ps(part[t], _mm256_set1_ps(dx[(t0 + t) * (K / S) + s]), acc[t]);
                part[t] = _mm256_setzero_ps();
            }
        }
    }
    store_column_block<TB>(acc, y, N, c, t0);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// AVX-512 with VNNI: two column blocks at once in 512-bit registers (16 columns a vpdpbusd, twice the
// products per instruction of the 256-bit form), up to 8 rows a pass: a row holds two registers (its
// 32-bit sum and its float accumulator) of the 32. A verification's integer dot products, not the weights'
// bytes, bound its time, so this is what keeps verifying K tokens near one step. Every output lane does
// the same integer sums and the same float operations in the same order as column_block: bit-identical.
constexpr bool PAIRED = true;
constexpr int GGUF_ROWS = 8;

inline __m512 join(__m256 low, __m256 high) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(low)), _mm256_castps_pd(high), 1));
}
inline __m512i join(__m256i low, __m256i high) { return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1); }

// step_codes of column blocks c (at `left`) and c + 1 (at `right`) in one register each, unpacked in 512-bit
// operations: half the instructions of unpacking each block on its own and joining them.
template <int LAYOUT>
inline void pair_step_codes(const uint8_t* left, const uint8_t* right, __m512i& first, __m512i& second) {
    constexpr __mmask16 HIGH_HALVES = 0xF0F0;  // dwords 4-7 of each 256-bit half
    if (LAYOUT == CRUMBS) {  // as step_codes
        const __m512i pairs = join(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(left))),
                                   _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(right))));
        const __m512i mask = _mm512_set1_epi8(0x03);
        first = _mm512_and_si512(_mm512_mask_blend_epi32(HIGH_HALVES, pairs, _mm512_srli_epi16(pairs, 2)), mask);
        second = _mm512_and_si512(_mm512_mask_blend_epi32(HIGH_HALVES, _mm512_srli_epi16(pairs, 4),
                                                          _mm512_srli_epi16(pairs, 6)), mask);
        return;
    }
    const __m512i packed = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(left)),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(right)));
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    first = _mm512_and_si512(packed, low_nibbles);
    second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
    if (looked_up(LAYOUT)) {  // the table's values + 128, as unsigned bytes (column_pair takes 128 sum(xq) off)
        const __m512i table = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm256_castsi256_si128(lookup_table<LAYOUT>())),
                                               _mm512_set1_epi8(static_cast<char>(0x80)));
        first = _mm512_shuffle_epi8(table, first);
        second = _mm512_shuffle_epi8(table, second);
    }
    if (LAYOUT == SIXBITS) {  // as step_codes: each code's top two bits to bits 4-5 of its byte
        const __m512i top = join(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(left + 32))),
                                 _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(right + 32))));
        const __m512i mask = _mm512_set1_epi8(0x30);
        first = _mm512_ternarylogic_epi32(first, _mm512_mask_blend_epi32(HIGH_HALVES, _mm512_slli_epi16(top, 4),
                                                                         _mm512_slli_epi16(top, 2)), mask, 0xF8);
        second = _mm512_ternarylogic_epi32(second, _mm512_mask_blend_epi32(HIGH_HALVES, top, _mm512_srli_epi16(top, 2)),
                                           mask, 0xF8);
    }
}

// acc + in each 32-bit lane the sum of its four unsigned bytes of u times the four signed bytes at `four`,
// broadcast by the instruction itself ({1to16}). For _mm512_set1_epi32 from memory GCC emits a separate
// vpbroadcastd, an issue slot a row that the dot products need once 8 rows share each load of the codes.
inline __m512i dot_accumulate_broadcast(__m512i acc, __m512i u, const int8_t* four) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(four)));
    return acc;
}

// A thread reads column blocks c and c + 1 side by side, then c + 2 and c + 3: two streams, each one column
// block long (the codes: 6 KB at K = 1536). Prefetching straight ahead would run from the left block into
// the right one (already on its way) and from the right block into the next pair's left one, so the next
// pair's right stream would start cold. Near a block's end (`along` bytes into one of `stream_bytes`) the
// prefetch jumps to the same side of the next pair instead.
inline void prefetch_pair_stream(const void* at, int64_t along, int64_t stream_bytes, int64_t distance, int64_t size) {
    const char* ahead = static_cast<const char*>(at) + distance + (along + distance >= stream_bytes ? stream_bytes : 0);
    for (int64_t line = 0; line < size; line += 64) _mm_prefetch(ahead + line, SPECDEC_PREFETCH_HINT);
}

// Rows t0..t0+TB-1 times column blocks c and c + 1 (every layout but SIGNED).
template <int TB, int LAYOUT, int G>
inline void column_pair(const int8_t* xq, const float* dx, const float* xsum, const uint8_t* codes,
                        const int8_t* group_codes, const uint16_t* super, float* y, int64_t K, int64_t N, int64_t S,
                        int64_t c, int64_t t0) {
    static_assert(LAYOUT != SIGNED, "signed codes take column_block (no 512-bit vpsignb)");
    constexpr int32_t OFFSET = looked_up(LAYOUT) ? 128 : 0;  // looked-up codes come offset to unsigned bytes
    const int64_t groups = K / G;
    const ColumnBlock<LAYOUT, G> left(codes, group_codes, super, K, S, c), right(codes, group_codes, super, K, S, c + 1);
    __m512 acc[TB], part[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) acc[t] = part[t] = _mm512_setzero_ps();
    __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, dmin[2] = {d[0], d[1]}, scale[2], minimum[2] = {d[0], d[1]};
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * G;
        left.group_scales(g, S, d[0], dmin[0], scale[0], minimum[0]);
        right.group_scales(g, S, d[1], dmin[1], scale[1], minimum[1]);
        const __m512 scales = join(scale[0], scale[1]), minimums = join(minimum[0], minimum[1]);
        const int64_t along = k0 / 8 * bytes_per_step(LAYOUT), block_bytes = K / 8 * bytes_per_step(LAYOUT);
        prefetch_pair_stream(left.step(k0), along, block_bytes, PREFETCH_BYTES, G / 8 * bytes_per_step(LAYOUT));
        prefetch_pair_stream(right.step(k0), along, block_bytes, PREFETCH_BYTES, G / 8 * bytes_per_step(LAYOUT));
        constexpr int64_t PER_GROUP = ColumnBlock<LAYOUT, G>::PER_GROUP;
        if (g % (64 / PER_GROUP) == 0) {  // the group codes: a cache line every 4 (8) groups
            constexpr int64_t GROUP_CODES_AHEAD = 512;
            prefetch_pair_stream(left.gc + g * PER_GROUP, g * PER_GROUP, groups * PER_GROUP, GROUP_CODES_AHEAD, 64);
            prefetch_pair_stream(right.gc + g * PER_GROUP, g * PER_GROUP, groups * PER_GROUP, GROUP_CODES_AHEAD, 64);
        }
        __m512i sum[TB];
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int step = 0; step < G / 8; step++) {
            const int64_t k = k0 + step * 8;
            __m512i first, second;
            pair_step_codes<LAYOUT>(left.step(k), right.step(k), first, second);
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) {
                const int8_t* row = xq + (t0 + t) * K + k;
                sum[t] = dot_accumulate_broadcast(dot_accumulate_broadcast(sum[t], first, row), second, row + 4);
            }
        }
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
            if (OFFSET) {  // sum((q + 128) xq) - 128 sum(xq): exact, the integer the other paths sum
                const int32_t group_sum = static_cast<int32_t>(xsum[(t0 + t) * groups + g]);
                sum[t] = _mm512_sub_epi32(sum[t], _mm512_set1_epi32(OFFSET * group_sum));
            }
            part[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), scales, part[t]);
            if (has_minimum(LAYOUT)) part[t] = _mm512_fmadd_ps(minimums, _mm512_set1_ps(xsum[(t0 + t) * groups + g]), part[t]);
        }
        if ((k0 + G) % S == 0) {
            const int64_t s = k0 / S;
#pragma GCC unroll 16
            for (int t = 0; t < TB; t++) {
                acc[t] = _mm512_fmadd_ps(part[t], _mm512_set1_ps(dx[(t0 + t) * (K / S) + s]), acc[t]);
                part[t] = _mm512_setzero_ps();
            }
        }
    }
    __m256 low[TB], high[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) {
        low[t] = _mm512_castps512_ps256(acc[t]);
        high[t] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1));
    }
    store_column_block<TB>(low, y, N, c, t0);
    store_column_block<TB>(high, y, N, c + 1, t0);
}
#else
constexpr bool PAIRED = false;
constexpr int GGUF_ROWS = 4;  // AVX2: 16 registers, three a row

template <int TB, int LAYOUT, int G>
inline void column_pair(const int8_t*, const float*, const float*, const uint8_t*, const int8_t*, const uint16_t*,
                        float*, int64_t, int64_t, int64_t, int64_t, int64_t) {}
#endif

// The first 64-byte boundary at or after `at` (a buffer allocated 64 bytes longer than it needs).
template <typename Element>
inline Element* cache_line_aligned(Element* at) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(at);
    return reinterpret_cast<Element*>(address + (64 - address % 64) % 64);
}

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
// AMX (Intel Sapphire Rapids and later): a tile product takes 16 rows x 16 columns x one group's inputs in one
// instruction, the integer work that bounds a long prompt's pass. Each group's sums still come out on their
// own (a tile store) and go through column_pair's float operations in its order, so every output is
// bit-identical to the 512-bit path's: only the integer sums' instruction changes.
constexpr bool TILES = true;
constexpr int64_t TILE_ROWS = 16;
// Fewer rows than this take the 512-bit path: a tile pass unpacks its column pair's codes for every call,
// paid back only over several tiles of rows.
constexpr int64_t TILE_MIN_ROWS = 32;

// Linux gives a process the tile registers only when it asks (ARCH_REQ_XCOMP_PERM for XTILEDATA); where the
// kernel or a hypervisor refuses, the 512-bit path serves.
inline bool tiles_permitted() {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    static const bool permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return permitted;
}

// Palette 1: tile 0 the sums (16 rows x 16 int32 columns), tile 1 the activations (16 rows x G bytes),
// tile 2 the codes (G / 4 rows, each 4 inputs of 16 columns). Loaded by each thread (tile state is per thread).
inline void configure_tiles(int64_t G) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t bytes_per_row[16];
        uint8_t rows[16];
    } config = {};
    config.palette = 1;
    config.rows[0] = TILE_ROWS, config.bytes_per_row[0] = 64;
    config.rows[1] = TILE_ROWS, config.bytes_per_row[1] = static_cast<uint16_t>(G);
    config.rows[2] = static_cast<uint8_t>(G / 4), config.bytes_per_row[2] = 64;
    _tile_loadconfig(&config);
}
inline void release_tiles() { _tile_release(); }

// Rows 0..rows_end-1 (a multiple of 16) times column blocks c and c + 1 (every layout but SIGNED). The pair's
// codes are unpacked once into `tiled` (K / 4 rows of 64 bytes: the vectors pair_step_codes makes, which
// are already the tile layout, 4 inputs of each column side by side), followed by its group scales
// ((K / G, 2, 16) floats), and reused by every tile of rows; `tiled` is cache-line aligned.
template <int LAYOUT, int G>
inline void column_pair_tiles(const int8_t* xq, const float* dx, const float* xsum, const uint8_t* codes,
                              const int8_t* group_codes, const uint16_t* super, float* y, int64_t K, int64_t N,
                              int64_t S, int64_t c, int64_t rows_end, uint8_t* tiled) {
    static_assert(LAYOUT != SIGNED, "signed codes take column_block");
    constexpr int32_t OFFSET = looked_up(LAYOUT) ? 128 : 0;  // as column_pair
    const int64_t groups = K / G;
    const ColumnBlock<LAYOUT, G> left(codes, group_codes, super, K, S, c), right(codes, group_codes, super, K, S, c + 1);
    for (int64_t k = 0; k < K; k += 8) {
        __m512i first, second;
        pair_step_codes<LAYOUT>(left.step(k), right.step(k), first, second);
        _mm512_storeu_si512(tiled + (k / 4) * 64, first);
        _mm512_storeu_si512(tiled + (k / 4 + 1) * 64, second);
    }
    // and each group's scales (d sc) and minimums (dmin mn) of the 16 columns, as column_pair computes them
    float* const scales_of = reinterpret_cast<float*>(tiled + K * 16);  // (groups, 2, 16)
    {
        __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, dmin[2] = {d[0], d[1]}, scale[2], minimum[2] = {d[0], d[1]};
        for (int64_t g = 0; g < groups; g++) {
            left.group_scales(g, S, d[0], dmin[0], scale[0], minimum[0]);
            right.group_scales(g, S, d[1], dmin[1], scale[1], minimum[1]);
            _mm512_store_ps(scales_of + g * 32, join(scale[0], scale[1]));
            _mm512_store_ps(scales_of + g * 32 + 16, join(minimum[0], minimum[1]));
        }
    }
    alignas(64) int32_t sums[TILE_ROWS][16];
    alignas(64) float acc[TILE_ROWS][16];
    for (int64_t t0 = 0; t0 < rows_end; t0 += TILE_ROWS) {
        __m512 part[TILE_ROWS];
#pragma GCC unroll 16
        for (int t = 0; t < TILE_ROWS; t++) {
            part[t] = _mm512_setzero_ps();
            _mm512_store_ps(acc[t], part[t]);
        }
        const int64_t per_super = S / G;
        int64_t in_super = 0;  // g % per_super, counted (a division a group showed in the profile)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t k0 = g * G;
            const bool ends_super = in_super == per_super - 1;
            in_super = ends_super ? 0 : in_super + 1;
            _tile_zero(0);
            _tile_loadd(1, xq + t0 * K + k0, K);
            _tile_loadd(2, tiled + (k0 / 4) * 64, 64);
            _tile_dpbsud(0, 1, 2);  // signed activations x unsigned codes
            _tile_stored(0, sums, 64);
            // the float work on the group's integer sums, as column_pair does it
            const __m512 scales = _mm512_load_ps(scales_of + g * 32), minimums = _mm512_load_ps(scales_of + g * 32 + 16);
#pragma GCC unroll 16
            for (int t = 0; t < TILE_ROWS; t++) {
                __m512i sum = _mm512_load_si512(sums[t]);
                if (OFFSET) {
                    const int32_t group_sum = static_cast<int32_t>(xsum[(t0 + t) * groups + g]);
                    sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(OFFSET * group_sum));
                }
                part[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scales, part[t]);
                if (has_minimum(LAYOUT)) part[t] = _mm512_fmadd_ps(minimums, _mm512_set1_ps(xsum[(t0 + t) * groups + g]), part[t]);
            }
            if (ends_super) {
                const int64_t s = k0 / S;
#pragma GCC unroll 16
                for (int t = 0; t < TILE_ROWS; t++) {
                    _mm512_store_ps(acc[t], _mm512_fmadd_ps(part[t], _mm512_set1_ps(dx[(t0 + t) * (K / S) + s]),
                                                            _mm512_load_ps(acc[t])));
                    part[t] = _mm512_setzero_ps();
                }
            }
        }
        for (int t = 0; t < TILE_ROWS; t++) _mm512_storeu_ps(y + (t0 + t) * N + c * 8, _mm512_load_ps(acc[t]));
    }
}
#else
constexpr bool TILES = false;
constexpr int64_t TILE_ROWS = 16, TILE_MIN_ROWS = 0;
inline bool tiles_permitted() { return false; }
inline void configure_tiles(int64_t) {}
inline void release_tiles() {}
template <int LAYOUT, int G>
inline void column_pair_tiles(const int8_t*, const float*, const float*, const uint8_t*, const int8_t*,
                              const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, uint8_t*) {}
#endif

template <int LAYOUT, int G>
void matmul(const float* x, const uint8_t* codes, const int8_t* group_codes, const uint16_t* super, float* y,
            int64_t T, int64_t K, int64_t N, int64_t S, int num_threads) {
    const int64_t supers = K / S, groups = K / G;
    // cache-line aligned: a tile load's rows (32 or 16 bytes each) then never straddle two lines
    std::vector<int8_t> xq_bytes(T * K + 64);
    int8_t* const xq_at = cache_line_aligned(xq_bytes.data());
    std::vector<float> dx(T * supers);
    std::vector<int32_t> super_sums(T * supers);  // quantize_rows' block sums: the groups' (below) serve here
    quantize_rows(x, T, K, 0, xq_at, dx.data(), super_sums.data(), S);
    // sum(xq) per row and group, exact in float32: the minimum's share
    std::vector<float> xsum(T * groups);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t g = 0; g < groups; g++) {
            int32_t total = 0;
            for (int64_t i = 0; i < G; i++) total += xq_at[t * K + g * G + i];
            xsum[t * groups + g] = static_cast<float>(total);
        }
    }
    const int64_t column_blocks = (N + 7) / 8;
    // Units of work: pairs of column blocks where the 512-bit path serves this layout, else single blocks.
    constexpr bool paired = PAIRED && LAYOUT != SIGNED;
    const int64_t units = paired ? (column_blocks + 1) / 2 : column_blocks;
    // Rows 0..tile_rows-1 of whole 16-column pairs go through the tiles where there are enough of them; the
    // rest (the last rows, an odd last block) through the 512-bit path, bit-identical.
    const bool tiled = paired && TILES && T >= TILE_MIN_ROWS && tiles_permitted();
    const int64_t tile_rows = tiled ? T / TILE_ROWS * TILE_ROWS : 0;
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<uint8_t> unpacked(tiled ? K * 16 + K / G * 32 * sizeof(float) + 64 : 0);
        uint8_t* unpacked_at = cache_line_aligned(unpacked.data());
        if (tiled) configure_tiles(G);
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t c = paired ? 2 * u : u;
            const bool whole_pair = paired && (c + 2) * 8 <= N;
            const int64_t first_row = tiled && whole_pair ? tile_rows : 0;
            if constexpr (paired) {
                if (first_row > 0) {
                    column_pair_tiles<LAYOUT, G>(xq_at, dx.data(), xsum.data(), codes, group_codes, super, y, K, N,
                                                 S, c, first_row, unpacked_at);
                }
            }
            for_row_blocks<GGUF_ROWS>(T - first_row, [&](auto rows, int64_t t) {
                constexpr int TB = decltype(rows)::value;
                const int64_t t0 = first_row + t;
                if constexpr (paired) {
                    if (c + 1 < column_blocks) {
                        column_pair<TB, LAYOUT, G>(xq_at, dx.data(), xsum.data(), codes, group_codes, super, y, K, N, S, c, t0);
                        return;
                    }
                }
                column_block<TB, LAYOUT, G>(xq_at, dx.data(), xsum.data(), codes, group_codes, super, y, K, N, S, c, t0);
            });
        }
        if (tiled) release_tiles();
    }
}

}  // namespace

// layout: 0 nibbles, 1 six bits, 2 signed bytes, 3 IQ4 indices, 4 two bits, 5 FP4 indices; group 16 or 32; super_size a multiple of group
// and of 32.
extern "C" void gguf_matmul(const float* x, const uint8_t* codes, const int8_t* group_codes, const uint16_t* super,
                            float* y, int64_t T, int64_t K, int64_t N, int32_t layout, int64_t group,
                            int64_t super_size, int num_threads) {
    const bool small = group == 16;
    switch (layout) {
        case NIBBLES:
            (small ? matmul<NIBBLES, 16> : matmul<NIBBLES, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
        case SIXBITS:
            (small ? matmul<SIXBITS, 16> : matmul<SIXBITS, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
        case IQ4:
            (small ? matmul<IQ4, 16> : matmul<IQ4, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
        case FP4:
            (small ? matmul<FP4, 16> : matmul<FP4, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
        case CRUMBS:
            (small ? matmul<CRUMBS, 16> : matmul<CRUMBS, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
        default:
            (small ? matmul<SIGNED, 16> : matmul<SIGNED, 32>)(x, codes, group_codes, super, y, T, K, N, super_size, num_threads);
            break;
    }
}
