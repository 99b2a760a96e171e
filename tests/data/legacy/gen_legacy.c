// Known answers for tests/quant_legacy.rs, made by ggml's own reference code.
//
// Build against ggml commit d99724f (the golden data's commit) the way ggml-base is built in a
// Release build (ggml-quants.c gets no -march flags, -O3 -DNDEBUG), with stubs for the few
// symbols of ggml.c it needs:
//
//   gcc -O3 -DNDEBUG -std=gnu11 -c $GGML/src/ggml-quants.c -I$GGML/include -I$GGML/src \
//       -I$GGML/src/ggml-cpu -o quants.o
//   gcc -O3 -DNDEBUG -std=gnu11 gen_legacy.c quants.o -I$GGML/include -I$GGML/src -lm -o gen
//   ./gen            # writes the files next to it
//
// Files (raw little-endian):
//   edge_x.f32                 EDGE_ROWS rows of 256 floats with zeros, NaN, infinities, subnormals
//                              and huge values, row by row
//   edge.<type>.bin            ggml_quantize_chunk-equivalent bytes (quantize_<type>, no imatrix)
//   edge.<type>.deq.f32        those bytes through dequantize_row_<type>
//   imat_x.f32, imat_w.f32     IMAT_ROWS rows of 256 floats and a 256-entry importance matrix
//   imat.<type>.bin            quantize_<type>(x, imat_w) for q4_0 q4_1 q5_0 q5_1
//   imat_edge.<type>.bin       quantize_<type>(edge_x, imat_w)
//   imat_ones.<type>.bin       quantize_<type>(imat_x, all-ones imatrix)
#include "ggml.h"
#include "ggml-quants.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- stubs for ggml.c
static size_t tsize(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0: return 18;  case GGML_TYPE_Q4_1: return 20;
        case GGML_TYPE_Q5_0: return 22;  case GGML_TYPE_Q5_1: return 24;
        case GGML_TYPE_Q8_0: return 34;  case GGML_TYPE_MXFP4: return 17;
        case GGML_TYPE_NVFP4: return 36; case GGML_TYPE_Q1_0: return 18;
        case GGML_TYPE_Q2_0: return 18;  case GGML_TYPE_TQ1_0: return 54;
        case GGML_TYPE_TQ2_0: return 66; default: abort();
    }
}
static int64_t bsize(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_NVFP4: case GGML_TYPE_Q2_0: return 64;
        case GGML_TYPE_Q1_0: return 128;
        case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0: return 256;
        default: return 32;
    }
}
size_t ggml_row_size(enum ggml_type t, int64_t ne) { return tsize(t) * ne / bsize(t); }
size_t ggml_type_size(enum ggml_type t) { return tsize(t); }
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d %s\n", file, line, fmt); abort(); }

// ---- data
#define N 256
#define EDGE_ROWS 12
#define IMAT_ROWS 4

static uint64_t s = 0x9E3779B97F4A7C15ull;
static float urand(void) { // [-1, 1)
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    return (float)(s >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static void put(const char * name, const void * p, size_t n) {
    FILE * f = fopen(name, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
    fclose(f);
}

typedef size_t (*qfn)(const float *, void *, int64_t, int64_t, const float *);
typedef void (*dfn)(const void *, float *, int64_t);
struct T { const char * name; enum ggml_type t; qfn q; dfn d; };

int main(void) {
    static float x[EDGE_ROWS * N];
    for (int r = 0; r < EDGE_ROWS; r++) {
        float * row = x + r * N;
        for (int j = 0; j < N; j++) row[j] = urand();
        switch (r) {
            case 0: for (int j = 0; j < N; j++) row[j] = 0.0f; break;
            case 1: for (int j = 0; j < N; j += 7) row[j] = NAN; break;                 // scattered NaN
            case 2: for (int j = 31; j < N; j += 32) row[j] = NAN; break;              // NaN last in block
            case 3: for (int j = 0; j < N; j += 9) row[j] = (j & 1) ? INFINITY : -INFINITY; break;
            case 4: for (int j = 0; j < N; j++) row[j] *= 1e30f; break;
            case 5: for (int j = 0; j < N; j++) row[j] *= 1e-30f; break;
            case 6: for (int j = 0; j < N; j++) row[j] *= 1e-39f; break;               // subnormals
            case 7: for (int j = 0; j < N; j++) row[j] = (j & 1) ? 3e38f : -3e38f; break; // max - min = inf
            case 8: for (int j = 0; j < N; j++) row[j] = 1e-44f * (float)(j % 5); break;
            case 9: for (int j = 0; j < N; j++) row[j] = (j % 3 == 0) ? 4e6f * row[j] : row[j]; break;
            case 10: for (int j = 0; j < N; j++) row[j] = -0.3125f; break;
            default: break;                                                             // plain
        }
    }
    put("edge_x.f32", x, sizeof x);

    static float w[N];
    for (int j = 0; j < N; j++) w[j] = 0.05f + fabsf(urand()) * (j % 4 == 0 ? 10.0f : 1.0f);
    static float xi[IMAT_ROWS * N];
    for (int i = 0; i < IMAT_ROWS * N; i++) { float u = urand(); xi[i] = u * u * u * 3.0f + 0.1f * urand(); }
    static float ones[N];
    for (int j = 0; j < N; j++) ones[j] = 1.0f;
    put("imat_w.f32", w, sizeof w);
    put("imat_x.f32", xi, sizeof xi);

    struct T types[] = {
        {"q4_0", GGML_TYPE_Q4_0, quantize_q4_0, (dfn) dequantize_row_q4_0},
        {"q4_1", GGML_TYPE_Q4_1, quantize_q4_1, (dfn) dequantize_row_q4_1},
        {"q5_0", GGML_TYPE_Q5_0, quantize_q5_0, (dfn) dequantize_row_q5_0},
        {"q5_1", GGML_TYPE_Q5_1, quantize_q5_1, (dfn) dequantize_row_q5_1},
        {"q8_0", GGML_TYPE_Q8_0, quantize_q8_0, (dfn) dequantize_row_q8_0},
        {"mxfp4", GGML_TYPE_MXFP4, quantize_mxfp4, (dfn) dequantize_row_mxfp4},
        {"nvfp4", GGML_TYPE_NVFP4, quantize_nvfp4, (dfn) dequantize_row_nvfp4},
        {"q1_0", GGML_TYPE_Q1_0, quantize_q1_0, (dfn) dequantize_row_q1_0},
        {"q2_0", GGML_TYPE_Q2_0, quantize_q2_0, (dfn) dequantize_row_q2_0},
        {"tq1_0", GGML_TYPE_TQ1_0, quantize_tq1_0, (dfn) dequantize_row_tq1_0},
        {"tq2_0", GGML_TYPE_TQ2_0, quantize_tq2_0, (dfn) dequantize_row_tq2_0},
    };
    static uint8_t q[EDGE_ROWS * N * 2];
    static float deq[EDGE_ROWS * N];
    char name[64];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        struct T * t = &types[k];
        size_t nb = t->q(x, q, EDGE_ROWS, N, NULL);
        snprintf(name, sizeof name, "edge.%s.bin", t->name); put(name, q, nb);
        t->d(q, deq, EDGE_ROWS * N);
        snprintf(name, sizeof name, "edge.%s.deq.f32", t->name); put(name, deq, sizeof deq);
        if (k < 4) {
            nb = t->q(xi, q, IMAT_ROWS, N, w);
            snprintf(name, sizeof name, "imat.%s.bin", t->name); put(name, q, nb);
            nb = t->q(x, q, EDGE_ROWS, N, w);
            snprintf(name, sizeof name, "imat_edge.%s.bin", t->name); put(name, q, nb);
            nb = t->q(xi, q, IMAT_ROWS, N, ones);
            snprintf(name, sizeof name, "imat_ones.%s.bin", t->name); put(name, q, nb);
        }
    }
    return 0;
}
