// Which float32 arithmetic vdpbf16ps (AVX512-BF16: acc += a[2i] b[2i] + a[2i+1] b[2i+1] per lane) performs on
// this CPU: a bf16 attention or matmul path whose AVX2 build must give the AVX-512 build's bits has to emulate
// it exactly, and every vendor's hardware has to agree with that emulation. Candidates: two fused
// multiply-adds, odd pair first (Intel's pseudo-code) or even first; one rounding of the exact sum; the two
// products (exact in float32) added first. The emulations run with MXCSR's DAZ and FTZ set, as the instruction
// flushes denormal inputs and outputs. Ranges: ordinary magnitudes, and products near the denormal boundary.
//
//     g++ -O2 -march=native -o /tmp/dpbf16_semantics scripts/lab/dpbf16_semantics.cpp && /tmp/dpbf16_semantics
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

static float from_bf16(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}
static uint16_t to_bf16(float f) {  // truncation: any bf16 value will do as an input
    uint32_t b;
    memcpy(&b, &f, 4);
    return b >> 16;
}
static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

// Lanes where the instruction equals each candidate, for inputs 2^[lo, hi] and accumulators 2^[acc_lo, acc_hi].
static void compare(int lo, int hi, int acc_lo, int acc_hi) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0, 1);
    std::uniform_int_distribution<int> exponent(lo, hi), acc_exponent(acc_lo, acc_hi);
    long same[4] = {0, 0, 0, 0}, total = 0;
    for (int it = 0; it < 100000; it++) {
        uint16_t a[16], b[16];
        float acc[8], hw[8];
        for (int i = 0; i < 16; i++)
            a[i] = to_bf16(ldexpf(normal(rng), exponent(rng))), b[i] = to_bf16(ldexpf(normal(rng), exponent(rng)));
        for (int i = 0; i < 8; i++) acc[i] = ldexpf(normal(rng), acc_exponent(rng));
        _mm256_storeu_ps(hw, _mm256_dpbf16_ps(_mm256_loadu_ps(acc), (__m256bh)_mm256_loadu_si256((__m256i*)a),
                                              (__m256bh)_mm256_loadu_si256((__m256i*)b)));
        for (int i = 0; i < 8; i++, total++) {
            const float ae = from_bf16(a[2 * i]), ao = from_bf16(a[2 * i + 1]);
            const float be = from_bf16(b[2 * i]), bo = from_bf16(b[2 * i + 1]);
            const float candidates[4] = {fmaf(ae, be, fmaf(ao, bo, acc[i])), fmaf(ao, bo, fmaf(ae, be, acc[i])),
                                         (float)((double)acc[i] + ((double)ae * be + (double)ao * bo)),
                                         acc[i] + (ae * be + ao * bo)};
            for (int c = 0; c < 4; c++) same[c] += bits_of(hw[i]) == bits_of(candidates[c]);
        }
    }
    printf("inputs 2^[%d,%d], sums 2^[%d,%d]: of %ld lanes equal to odd-first FMAs %ld, even-first %ld, "
           "one rounding %ld, products added first %ld\n", lo, hi, acc_lo, acc_hi, total, same[0], same[1], same[2],
           same[3]);
}

int main() {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    compare(-20, 20, -20, 20);       // attention's magnitudes
    compare(-68, -58, -130, -118);   // products and sums around the smallest normal float
}
