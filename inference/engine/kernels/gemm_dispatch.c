/* Which product serves a step's rows, inside the kernels: AMX's tiles (amx_gemm.c), the
 * panels' (panel_gemm.c) from the row counts kernels.load() sets (cpu_backend.py holds them),
 * else the grouped tiles of a few rows (q4_1_gemm.c, q8_0_gemm.c); and the library's
 * product entry points. */
#include <stdint.h>
#include <stdlib.h>

#include "gemm.h"

/* Products of at least this many rows take AMX's tiles (amx_gemm.c) where they run, the
 * layers' (Q4_1) and the head's (Q8_0); 0: never. */
static int amx_min_rows, amx_head_min_rows;

void set_amx_min_rows(int layers, int head) {
    amx_min_rows = layers;
    amx_head_min_rows = head;
}

/* Products of at least this many rows take panel_gemm.c's 512-bit tiles where the kernels
 * are built for AVX512-VNNI (AMX's first, where they take the product), the layers' and the
 * head's; 0: never (kernels/__init__.py sets the measured limits at load). */
static int panel_min_rows, panel_head_min_rows;

void set_panel_min_rows(int layers, int head) {
    panel_min_rows = layers;
    panel_head_min_rows = head;
}

int q4_matmul(const Q4Matrix *w, const float *x, int rows, int as_rows, float *y,
              int nthreads) {
    if (amx_min_rows > 0 && as_rows >= amx_min_rows &&
        q4_amx_matmul(w, x, rows, y, nthreads) == 0)
        return 0;
    QuantizedRows q;
    if (quantize_rows(x, rows, w->k, &q, nthreads, 0)) {
        free_rows(&q);
        return -1;
    }
    int rc = 0;
    if (panel_min_rows > 0 && as_rows >= panel_min_rows) {
        rc = q4_panel8_matmul(w, q.qx, q.dx, q.sx, rows, y, nthreads);
    } else {
        q4_int8_matmul(w, &q, rows, y, nthreads);
    }
    free_rows(&q);
    return rc;
}

/* The panels from the rows a step of as_rows takes them (q8_0_gemm_i16's limit: 1, every
 * step; 0, never). */
static inline int panels_from(int as_rows) {
    return panel_head_min_rows > 0 && as_rows >= panel_head_min_rows;
}

int q8_layers_matmul(const Q8Matrix *w, const float *x, int rows, int as_rows, float *y,
                     int nthreads) {
#if HAVE_VNNI
    /* 8-bit x, as llama.cpp takes these layers: a few rows a tile, on the panels from the
     * head's panel rows. */
    const int panels = panels_from(as_rows);
    QuantizedRows q;
    int rc = quantize_rows(x, rows, w->k, &q, nthreads, 1);
    if (!rc) {
        if (panels)
            rc = q8_panel8_matmul(w, q.qx, q.dx, q.sx, q.s16, rows, y, nthreads);
        else
            q8_int8_matmul(w, &q, rows, y, nthreads);
    }
    free_rows(&q);
    return rc;
#else
    return q8_i16_matmul(w, x, rows, y, nthreads, panels_from(as_rows));
#endif
}

/* y [rows, N] = x [rows, K] @ W.T for a Q8_0 or Q6_K layer matrix (Q6_K's where sc is
 * given, d then its fp16 d per 256) as the native path multiplies it (q8_layers_matmul);
 * 0, -1 out of memory, -2 K not whole blocks. */
int q8_0_layers_gemm(const int8_t *qs, const void *d, int N, int K, const float *x, int rows,
                     int as_rows, float *y, int nthreads, const int8_t *sc) {
    if (K % (sc ? QK_K : QK)) return -2;
    Q8Matrix w = q8_matrix(qs, d, N, K, sc);
    return q8_layers_matmul(&w, x, rows, as_rows, y, nthreads);
}

/* y [rows, N] = x [rows, K] @ W.T for Q4_1 W in the kernel layout. */
int q4_1_gemm(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
              const float *x, int rows, float *y, int nthreads, const uint8_t *sc,
              const uint8_t *mn, const uint8_t *qh) {
    if (K % QK) return -2;
    Q4Matrix w = {qs, d, m, N, K, sc, mn, qh};
    return q4_matmul(&w, x, rows, rows, y, nthreads);
}

/* y [rows, N] = x [rows, K] @ W.T for Q8_0 W in the kernel layout (Q6_K's where sc is
 * given, d then its fp16 d per 256), by the product a step of as_rows rows takes
 * (q4_matmul's as_rows). */
int q8_0_gemm(const int8_t *qs, const void *d, int N, int K, const float *x, int rows,
              int as_rows, float *y, int nthreads, const int8_t *sc) {
    if (K % (sc ? QK_K : QK)) return -2;
    Q8Matrix w = q8_matrix(qs, d, N, K, sc);
    if (amx_head_min_rows > 0 && as_rows >= amx_head_min_rows &&
        q8_amx_matmul(&w, x, rows, y, nthreads) == 0)
        return 0;
    return q8_i16_matmul(&w, x, rows, y, nthreads, panels_from(as_rows));
}

/* 1 where q4_1_gemm_bf16 runs (built with AVX512-BF16), else 0. */
int q4_1_bf16_available(void) { return HAVE_BF16_GEMM; }

/* y [rows, N] = x [rows, K] @ W.T for Q4_1 W in the kernel layout, x rounded to bf16 and
 * the weights exact; -3 where this build has no AVX512-BF16. */
int q4_1_gemm_bf16(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int N, int K,
                   const float *x, int rows, float *y, int nthreads, const uint8_t *sc,
                   const uint8_t *mn, const uint8_t *qh) {
#if HAVE_BF16_GEMM
    if (K % QK) return -2;
    Bf16Rows q;
    int rc = round_rows_bf16(x, rows, K, &q);
    if (!rc) {
        Q4Matrix w = {qs, d, m, N, K, sc, mn, qh};
        q4_bf16_matmul(&w, &q, rows, y, nthreads);
    }
    free(q.xb);
    free(q.sx);
    return rc;
#else
    (void)qs, (void)d, (void)m, (void)N, (void)K, (void)x, (void)rows, (void)y, (void)nthreads;
    (void)sc, (void)mn, (void)qh;
    return -3;
#endif
}
