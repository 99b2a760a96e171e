// Known answers for the scalar dot products: ggml's portable `ggml_vec_dot_*_generic` kernels
// (src/ggml-cpu/quants.c, built without -march flags so no FMA contraction), row r of
// edge.<type>.bin against row r of the activations, for the edge rows of gen_legacy.c.
//
//   gcc -O3 -DNDEBUG -std=gnu11 -c $GGML/src/ggml-cpu/quants.c -I$GGML/include -I$GGML/src \
//       -I$GGML/src/ggml-cpu -o genq.o
//   gcc -O3 -DNDEBUG -std=gnu11 gen_dot.c genq.o quants.o -I$GGML/include -I$GGML/src -lm -o gen_dot
//   ./gen_dot       # needs edge_x.f32, edge.*.bin, edge.cpu.q8_*.bin
//
// Files: edge.q8_K.bin (quantize_row_q8_K_ref of edge_x, the ternary types' activations) and
// edge.dot.<type>.f32 (12 results per type).
#include "ggml.h"
#include "ggml-impl.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

float ggml_table_f32_f16[1 << 16];

size_t ggml_row_size(enum ggml_type t, int64_t ne) { (void) t; (void) ne; abort(); }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
void ggml_abort(const char * file, int line, const char * fmt, ...) { (void) file; (void) line; (void) fmt; abort(); }
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);

typedef void (*dotfn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
#define DOT(name) void name(int, float *, size_t, const void *, size_t, const void *, size_t, int);
DOT(ggml_vec_dot_q4_0_q8_0_generic) DOT(ggml_vec_dot_q4_1_q8_1_generic) DOT(ggml_vec_dot_q5_0_q8_0_generic)
DOT(ggml_vec_dot_q5_1_q8_1_generic) DOT(ggml_vec_dot_q8_0_q8_0_generic) DOT(ggml_vec_dot_mxfp4_q8_0_generic)
DOT(ggml_vec_dot_nvfp4_q8_0_generic) DOT(ggml_vec_dot_q1_0_q8_0_generic) DOT(ggml_vec_dot_q2_0_q8_0)
DOT(ggml_vec_dot_tq1_0_q8_K_generic) DOT(ggml_vec_dot_tq2_0_q8_K_generic)

#define ROWS 12
#define N 256

static void * get(const char * name, size_t n) {
    void * p = malloc(n);
    FILE * f = fopen(name, "rb");
    if (!f || fread(p, 1, n, f) != n) { perror(name); exit(1); }
    fclose(f);
    return p;
}

static void put(const char * name, const void * p, size_t n) {
    FILE * f = fopen(name, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
    fclose(f);
}

int main(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = GGML_FP16_TO_FP32((ggml_fp16_t) i);
    float * x = get("edge_x.f32", ROWS * N * 4);
    static uint8_t q8k[ROWS * 292];
    quantize_row_q8_K_ref(x, q8k, ROWS * N);
    put("edge.q8_K.bin", q8k, sizeof q8k);
    uint8_t * q8_0 = get("edge.cpu.q8_0.bin", ROWS * N / 32 * 34);
    uint8_t * q8_1 = get("edge.cpu.q8_1.bin", ROWS * N / 32 * 36);

    struct { const char * name; size_t row; dotfn f; int act; } t[] = {
        {"q4_0", 144, ggml_vec_dot_q4_0_q8_0_generic, 0}, {"q4_1", 160, ggml_vec_dot_q4_1_q8_1_generic, 1},
        {"q5_0", 176, ggml_vec_dot_q5_0_q8_0_generic, 0}, {"q5_1", 192, ggml_vec_dot_q5_1_q8_1_generic, 1},
        {"q8_0", 272, ggml_vec_dot_q8_0_q8_0_generic, 0}, {"mxfp4", 136, ggml_vec_dot_mxfp4_q8_0_generic, 0},
        {"nvfp4", 144, ggml_vec_dot_nvfp4_q8_0_generic, 0}, {"q1_0", 36, ggml_vec_dot_q1_0_q8_0_generic, 0},
        {"q2_0", 72, ggml_vec_dot_q2_0_q8_0, 0}, {"tq1_0", 54, ggml_vec_dot_tq1_0_q8_K_generic, 2},
        {"tq2_0", 66, ggml_vec_dot_tq2_0_q8_K_generic, 2},
    };
    char name[64];
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        snprintf(name, sizeof name, "edge.%s.bin", t[k].name);
        uint8_t * w = get(name, ROWS * t[k].row);
        float out[ROWS];
        for (int r = 0; r < ROWS; r++) {
            const uint8_t * y = t[k].act == 0 ? q8_0 + r * 8 * 34 : t[k].act == 1 ? q8_1 + r * 8 * 36 : q8k + r * 292;
            t[k].f(N, &out[r], 0, w + r * t[k].row, 0, y, 0, 1);
        }
        snprintf(name, sizeof name, "edge.dot.%s.f32", t[k].name);
        put(name, out, sizeof out);
        free(w);
    }
    return 0;
}
