/* What the kernels' C files share: the weights' kernel layouts and the thread pool
 * (quant_gemm.c), and the products on AMX tiles (amx_gemm.c). */
#ifndef CHATAPP_KERNELS_COMMON_H
#define CHATAPP_KERNELS_COMMON_H
#include <stdint.h>

#define QK 32   /* weights a block, along k */
#define GROUP 8 /* columns side by side in the kernel layout */

/* Q4_1 in the kernel layout (quant_gemm.c): per group of 8 columns and block, 128 bytes of
 * nibbles, 4 vectors of 32; vector j holds k 8j..8j+3 in its low nibbles and 8j+4..8j+7 in
 * its high ones, 4 bytes per column (lane c = column c). d and m: fp16 [group][block][8]. */
typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int n, k; /* the true column count; the arrays hold whole groups (zero padded) */
} Q4Matrix;

/* Q8_0 in the kernel layout: per group of 8 columns and block, 16 pairs of k, each 16
 * bytes (k, k + 1 of each column); d float32 [group][block][8]. */
typedef struct {
    const int8_t *qs;
    const float *d;
    int n, k;
} Q8Matrix;

typedef void (*chunk_fn)(void *arg, int chunk);
/* fn(arg, c) for every chunk c in 0..chunks-1, on up to nth threads (the caller one of
 * them); returns when all are done. Not exported from the library. */
__attribute__((visibility("hidden"))) void pool_run(chunk_fn fn, void *arg, int chunks, int nth);

/* y [rows, N] = x [rows, K] @ W.T on AMX tiles (amx_gemm.c): 0, or -2 for a shape they do
 * not take, -3 where AMX cannot run, -1 out of memory. */
__attribute__((visibility("hidden"))) int q4_amx_matmul(const Q4Matrix *w, const float *x, int rows,
                                                        float *y, int nthreads);
__attribute__((visibility("hidden"))) int q8_amx_matmul(const Q8Matrix *w, const float *x, int rows,
                                                        float *y, int nthreads);

#endif
