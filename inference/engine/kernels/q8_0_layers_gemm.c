/* Q8_0 and Q6_K layers' 16-bit products (a GGUF whose layers have more than 4 bits), the
 * larger steps' (and, without AVX512-VNNI, the native path's: gemm_dispatch.c's
 * q8_layers_matmul, which with it takes 8-bit x as llama.cpp does): the head's products
 * (q8_0_gemm's grouped tiles, then the panels from `panel_min_rows`) at every size, never
 * AMX's bf16 tiles. Those round x and each d * q to bf16: ~2.5e-3 of a
 * product against ~4e-5 here, which on a tiny llama's Q5_K_M file moved a next token's
 * choice 0.95 nats off llama.cpp's, where the 16-bit products kept it within 0.48
 * (tests/engine/test_gguf_models.py). */
#include <stdint.h>
#include <stdlib.h>

#include "gemm.h"

int q8_i16_matmul(const Q8Matrix *w, const float *x, int rows, float *y, int nthreads,
                   int panel_min_rows) {
    if (panel_min_rows > 0 && rows >= panel_min_rows)
        return q8_panel16_matmul(w, x, rows, y, nthreads);
    Wide q;
    if (quantize_rows16(x, rows, w->k, &q)) {
        free(q.qx);
        free(q.dx);
        return -1;
    }
    q8_int16_matmul(w, &q, rows, y, nthreads);
    free(q.qx);
    free(q.dx);
    return 0;
}

/* y [rows, N] = x [rows, K] @ W.T for Q8_0 W in the kernel layout (Q6_K's where sc is
 * given, d then its fp16 d per 256), x at 16 bits a block; the panels from panel_min_rows
 * rows (0: never). 0, -1 out of memory, -2 K not whole blocks. */
int q8_0_gemm_i16(const int8_t *qs, const void *d, int N, int K, const float *x, int rows,
                  float *y, int nthreads, int panel_min_rows, const int8_t *sc) {
    if (K % (sc ? QK_K : QK)) return -2;
    Q8Matrix w = q8_matrix(qs, d, N, K, sc);
    return q8_i16_matmul(&w, x, rows, y, nthreads, panel_min_rows);
}
