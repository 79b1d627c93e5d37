// How many vpmaddubsw (256-bit) this CPU retires per second, and its clock: the ceiling of the integer
// kernels (kernels/integer_matmul.cpp, gguf_matmul.cpp), which need one vpmaddubsw per 32 multiply-adds.
// 12 independent chains, so latency does not bound it. docs/notes/benchmarks-diary-2026.md section 16:
//   g++ -O2 -mavx2 -o /tmp/maddubs_rate scripts/lab/maddubs_rate.cpp && /tmp/maddubs_rate
#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main() {
    __m256i a[12], b = _mm256_set1_epi8(3);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi8(i + 1);
    const long n = 200000000;
    auto t0 = std::chrono::steady_clock::now();
    for (long r = 0; r < n; r++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) { a[i] = _mm256_maddubs_epi16(a[i], b); }
        asm volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]), "+x"(a[6]), "+x"(a[7]), "+x"(a[8]), "+x"(a[9]), "+x"(a[10]), "+x"(a[11]));
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int out = 0; for (int i = 0; i < 12; i++) out += _mm256_extract_epi32(a[i], 0);
    printf("%.2f G maddubs/s (%d)\n", n * 12 / s / 1e9, out);
    // clock estimate: dependent adds
    long x = 1; t0 = std::chrono::steady_clock::now();
    for (long r = 0; r < n; r++) { asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%.2f GHz (dependent adds) %ld\n", n * 4 / s / 1e9, x);
}
