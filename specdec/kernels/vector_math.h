// Vector helpers shared by the CPU kernels (included, not compiled on its own).
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

// Which cache software prefetches of a stream from memory (weights, a deep KV cache) go to: L1 was measured
// best on an Intel Xeon. On AMD Zen 4 asking for L2 only streamed a one-row weight pass faster (and was even
// at eight rows), and a deep cache's keys and values faster too, so kernels/build.py defines
// SPECDEC_PREFETCH_TO_L2 on AMD CPUs.
#ifdef SPECDEC_PREFETCH_TO_L2
#define SPECDEC_PREFETCH_HINT _MM_HINT_T1
#else
#define SPECDEC_PREFETCH_HINT _MM_HINT_T0
#endif

namespace vector_math {

// The largest of the 8 lanes of v (exact: no order to fix).
inline float lane_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// The 8 lanes of v summed in a fixed order: reductions that end here round the same on every call.
inline float lane_sum(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
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

// A KV cache's element types (kernels/ops.py KV_TYPES has the same codes): two-byte caches halve the bytes a
// deep pass reads; a key is widened to float32 exactly, so the arithmetic on it is float32's on its value.
enum KvType : int { KV_FLOAT32 = 0, KV_BFLOAT16 = 1, KV_FLOAT16 = 2 };
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline __m256 load8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) {
    const uint32_t bits = (uint32_t)x.bits << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}
inline float to_float(f16 x) { return _cvtsh_ss(x.bits); }

// Stores x rounded to the nearest even value of the type, as torch's conversions round (so a cache written
// here holds what `cache[...] = tensor` writes).
inline void store(float* p, float x) { *p = x; }
inline void store(bf16* p, float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    p->bits = x != x ? 0x7fc0 : (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
inline void store(f16* p, float x) { p->bits = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// call(element) with a value of the element type kv_type names (float, bf16 or f16): a kernel's entry point
// picks its typed body once, e.g. with_kv_type(kv_type, [&](auto element) { body<decltype(element)>(...); }).
template <typename Call>
inline void with_kv_type(int kv_type, Call&& call) {
    switch (kv_type) {
        case KV_BFLOAT16: return call(bf16{});
        case KV_FLOAT16: return call(f16{});
        default: return call(0.0f);
    }
}

inline int64_t kv_element_size(int64_t kv_type) { return kv_type == KV_FLOAT32 ? 4 : 2; }

}  // namespace vector_math
