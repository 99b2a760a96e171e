// Known answers for the CPU activation converters (`from_float`) of ggml's x86 AVX2 build, on the
// edge rows of edge_x.f32 (made by gen_legacy.c).
//
//   gcc -O3 -DNDEBUG -std=gnu11 -mavx2 -mfma -mf16c -c $GGML/src/ggml-cpu/arch/x86/quants.c \
//       -I$GGML/include -I$GGML/src -I$GGML/src/ggml-cpu -o x86q.o
//   gcc -O3 -DNDEBUG -std=gnu11 -mavx2 -mfma -mf16c gen_cpu.c x86q.o quants.o \
//       -I$GGML/include -I$GGML/src -lm -o gen_cpu     # quants.o: see gen_legacy.c
//   ./gen_cpu
//
// Files: edge.cpu.q8_0.bin, edge.cpu.q8_1.bin (x86 quantize_row_q8_0 / _q8_1), edge.cpu.f16.bin
// (ggml_cpu_fp32_to_fp16's F16C path, 8 at a time), edge.cpu.bf16.bin (GGML_FP32_TO_BF16), and
// edge.f16.bin (GGML_FP32_TO_FP16, what ggml_quantize_chunk uses for F16).
#include "ggml.h"
#include "ggml-impl.h"
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// tables the x86 object references but the converters do not use
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
float ggml_table_f32_ue4m3[1 << 8];

// stubs for ggml.c (quants.o needs them; see gen_legacy.c)
size_t ggml_row_size(enum ggml_type t, int64_t ne) { (void) t; (void) ne; abort(); }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
void ggml_abort(const char * file, int line, const char * fmt, ...) { (void) file; (void) line; (void) fmt; abort(); }

void quantize_row_q8_0(const float * x, void * y, int64_t k);
void quantize_row_q8_1(const float * x, void * y, int64_t k);

#define N (12 * 256)

static void put(const char * name, const void * p, size_t n) {
    FILE * f = fopen(name, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
    fclose(f);
}

int main(void) {
    static float x[N];
    FILE * f = fopen("edge_x.f32", "rb");
    if (!f || fread(x, sizeof(float), N, f) != N) { perror("edge_x.f32"); return 1; }
    fclose(f);

    static uint8_t q[N / 32 * 36];
    quantize_row_q8_0(x, q, N);
    put("edge.cpu.q8_0.bin", q, N / 32 * 34);
    quantize_row_q8_1(x, q, N);
    put("edge.cpu.q8_1.bin", q, N / 32 * 36);

    static uint16_t h[N];
    for (int i = 0; i < N; i += 8) {
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    put("edge.cpu.f16.bin", h, sizeof h);
    for (int i = 0; i < N; i++) {
        ggml_bf16_t b = GGML_FP32_TO_BF16(x[i]);
        h[i] = b.bits;
    }
    put("edge.cpu.bf16.bin", h, sizeof h);
    for (int i = 0; i < N; i++) {
        h[i] = GGML_FP32_TO_FP16(x[i]);
    }
    put("edge.f16.bin", h, sizeof h);
    return 0;
}
