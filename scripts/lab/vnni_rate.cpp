// How many 512-bit vpdpbusd this CPU retires per second, alone and beside the other operations a GGUF
// kernel's group needs (the FMAs of its float work, an integer multiply, unpacking): which of them take the
// dot products' issue slots. 12 independent chains in inline assembly (the compiler cannot spill or fold
// them). docs/notes/benchmarks-diary-2026.md section 39:
//   g++ -O2 -march=native -o /tmp/vnni_rate scripts/lab/vnni_rate.cpp && /tmp/vnni_rate
#include <chrono>
#include <cstdio>
#include <cstdint>
alignas(64) int8_t x[8192];
#define R12(OP) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12)
#define EMB(i) "vpdpbusd " #i "*4(%0)%{1to16%}, %%zmm0, %%zmm" #i "\n"
#define BC(i) "vpbroadcastd " #i "*4(%0), %%zmm20\n vpdpbusd %%zmm20, %%zmm0, %%zmm" #i "\n"
#define BC2(i) "vpbroadcastd " #i "*4(%0), %%zmm" #i "1\n"
#define BC2B(i) "vpdpbusd %%zmm" #i "1, %%zmm0, %%zmm" #i "\n"
#define REG(i) "vpdpbusd %%zmm13, %%zmm0, %%zmm" #i "\n"
#define REGFMA(i) "vpdpbusd %%zmm13, %%zmm0, %%zmm" #i "\n"
#define YEMB(i) "vpdpbusd " #i "*4(%0)%{1to8%}, %%ymm0, %%ymm" #i "\n"
#define YREG(i) "vpdpbusd %%ymm13, %%ymm0, %%ymm" #i "\n"
template <int W> void run(const char* name, long n, double per) {
    auto t0 = std::chrono::steady_clock::now();
    const int8_t* p = x;
    for (long i = 0; i < n; i++) {
        if (W == 0) asm volatile(R12(EMB) :: "r"(p) : "memory");
        if (W == 1) asm volatile(R12(BC) :: "r"(p) : "memory");
        if (W == 2) asm volatile(R12(REG) :: "r"(p) : "memory");
        if (W == 3) asm volatile(R12(YEMB) :: "r"(p) : "memory");
        if (W == 4) asm volatile(R12(YREG) :: "r"(p) : "memory");
        if (W == 5) asm volatile(R12(EMB) "vfmadd231ps %%zmm14, %%zmm15, %%zmm16\n vfmadd231ps %%zmm14, %%zmm15, %%zmm17\n vfmadd231ps %%zmm14, %%zmm15, %%zmm18\n" :: "r"(p) : "memory");
        if (W == 6) asm volatile(R12(EMB) "vcvtdq2ps %%zmm1, %%zmm16\n vcvtdq2ps %%zmm2, %%zmm17\n vcvtdq2ps %%zmm3, %%zmm18\n" :: "r"(p) : "memory");
        if (W == 7) asm volatile(R12(EMB) "vpmulld %%zmm1, %%zmm15, %%zmm16\n vpmulld %%zmm2, %%zmm15, %%zmm17\n vpmulld %%zmm3, %%zmm15, %%zmm18\n" :: "r"(p) : "memory");
        if (W == 8) asm volatile(R12(EMB) "vpaddd %%zmm1, %%zmm15, %%zmm16\n vpandd %%zmm2, %%zmm15, %%zmm17\n vpsrlw $4, %%zmm3, %%zmm18\n" :: "r"(p) : "memory");
        if (W == 9) asm volatile(R12(EMB) "vpmaddwd %%zmm1, %%zmm15, %%zmm16\n vpmaddwd %%zmm2, %%zmm15, %%zmm17\n vpmaddwd %%zmm3, %%zmm15, %%zmm18\n" :: "r"(p) : "memory");
        p = x + ((i & 63) << 6);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%-34s %.2f G ops/s (%.1f G MAC/s)\n", name, n * 12 / s / 1e9, n * 12 * per / s / 1e9);
}
int main() {
    long n = 25000000;
    run<2>("zmm vpdpbusd reg", n, 64); run<0>("zmm vpdpbusd, broadcast operand", n, 64); run<1>("zmm vpbroadcastd + vpdpbusd", n, 64);
    run<4>("ymm vpdpbusd reg", n, 32); run<3>("ymm vpdpbusd, broadcast operand", n, 32);
    run<5>("zmm emb + 3 fma", n, 64); run<6>("zmm emb + 3 cvt", n, 64); run<7>("zmm emb + 3 pmulld", n, 64);
    run<8>("zmm emb + add/and/shift", n, 64); run<9>("zmm emb + 3 pmaddwd", n, 64);
}
