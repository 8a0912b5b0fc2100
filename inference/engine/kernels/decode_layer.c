/* A whole decoder layer for a decode step of a few rows.
 *
 * The same maths as LlamaModel.forward (model.py) for rows that each decode one token: RMS
 * norm, the fused q/k/v product (plus its bias where the layer has one: Qwen2), each head
 * of q and k RMS-normed where the layer has those norms (Qwen3), rope, the new K/V into the
 * paged pool, attention over each row's blocks, o, residual, norm, gate/up, SiLU, down,
 * residual. In torch this is ~30 small ops a layer whose dispatch cost more than the
 * 4-bit matrix products themselves.
 * Each product's matrix is Q4_1 or Q8_0 (decode.h's LayerMatrix); q/k/v's may be two.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "decode.h"
#include "gemm.h"

/* y = x @ W.T by W's format: Q4_1 by 8-bit activations (gemm_dispatch.c's q4_matmul), Q8_0
 * by 16-bit ones (q8_layers_matmul), as the torch path's products take them. */
static inline int layer_matmul(const LayerMatrix *w, const float *x, int rows, int as_rows,
                               float *y, int nthreads) {
    if (w->format == LAYER_Q8_0) return q8_layers_matmul(&w->q8, x, rows, as_rows, y, nthreads);
    return q4_matmul(&w->q4, x, rows, as_rows, y, nthreads);
}

/* The q/k/v product into qkv [rows, n]: one product, or two side by side (qkv_split). */
static int qkv_matmul(const LayerWeights *w, const float *x, int rows, int as_rows, int n,
                      float *qkv, int nthreads) {
    if (!w->qkv_split) return layer_matmul(&w->qkv, x, rows, as_rows, qkv, nthreads);
    const int a = w->qkv_split, b = n - a;
    float *ya = malloc(sizeof(float) * rows * a), *yb = malloc(sizeof(float) * rows * b);
    int rc = -1;
    if (ya && yb && !layer_matmul(&w->qkv, x, rows, as_rows, ya, nthreads) &&
        !layer_matmul(&w->qkv_v, x, rows, as_rows, yb, nthreads)) {
        for (int r = 0; r < rows; r++) {
            memcpy(qkv + (size_t)r * n, ya + (size_t)r * a, sizeof(float) * a);
            memcpy(qkv + (size_t)r * n + a, yb + (size_t)r * b, sizeof(float) * b);
        }
        rc = 0;
    }
    free(ya);
    free(yb);
    return rc;
}

/* as_rows: the step the products are picked for (q4_matmul's), rows or fewer. */
int decode_layer(const LayerShape *s, const LayerWeights *w, float *x, int rows, int as_rows,
                 const int64_t *positions, const float *cos, const float *sin,
                 const int64_t *block_tables, int table_width, void *pool, int nthreads) {
    int H = s->hidden, d = s->head_dim, hq = s->heads, hkv = s->kv_heads;
    int nqkv = (hq + 2 * hkv) * d, bs = s->block_size;
    size_t head_stride = kv_head_elems(s);
    float *h = malloc(sizeof(float) * rows * H);
    float *qkv = malloc(sizeof(float) * rows * nqkv);
    float *attn = malloc(sizeof(float) * rows * hq * d);
    float *gu = malloc(sizeof(float) * rows * 2 * s->inter);
    float *act = malloc(sizeof(float) * rows * s->inter);
    int64_t *slots = malloc(sizeof(int64_t) * rows);
    int rc = -1;
    if (!h || !qkv || !attn || !gu || !act || !slots) goto out;

    /* The work between the products runs over the pool too (row_ops.c), as they do. */
    add_rms_norm(x, NULL, w->input_norm, rows, H, s->eps, h, nthreads);
    if (qkv_matmul(w, h, rows, as_rows, nqkv, qkv, nthreads)) goto out;
    if (w->qkv_bias)
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < nqkv; i++) qkv[(size_t)r * nqkv + i] += w->qkv_bias[i];
    if (w->q_norm)
        for (int r = 0; r < rows; r++) {
            /* Each head a row of d: q's heads, then k's, in place (one thread: a few rows). */
            float *q = qkv + (size_t)r * nqkv, *k = q + (size_t)hq * d;
            add_rms_norm(q, NULL, w->q_norm, hq, d, s->eps, q, 1);
            add_rms_norm(k, NULL, w->k_norm, hkv, d, s->eps, k, 1);
        }
    for (int r = 0; r < rows; r++) {
        int64_t pos = positions[r];
        const int64_t *table = block_tables + (size_t)r * table_width;
        slots[r] = table[pos / bs] * bs + pos % bs;
    }
    KvPut put = {slots, pool, hq, 2 * hkv, head_stride, s->kv_type};
    rope_put_rows(qkv, rows, nqkv, hq + hkv, d, cos, sin, &put, nthreads);
    if (decode_attention(s, qkv, rows, positions, block_tables, table_width, pool, attn,
                         nthreads))
        goto out;
    if (layer_matmul(&w->o, attn, rows, as_rows, h, nthreads)) goto out;
    add_rms_norm(x, h, w->post_norm, rows, H, s->eps, h, nthreads);
    if (layer_matmul(&w->gate_up, h, rows, as_rows, gu, nthreads)) goto out;
    silu_mul(gu, rows, s->inter, act, nthreads);
    if (layer_matmul(&w->down, act, rows, as_rows, h, nthreads)) goto out;
    for (int i = 0; i < rows * H; i++) x[i] += h[i];
    rc = 0;
out:
    free(h);
    free(qkv);
    free(attn);
    free(gu);
    free(act);
    free(slots);
    return rc;
}

/* Every layer of a step in one call: one hand-off of the GIL a step instead of one a layer
 * (when the web side's thread took the GIL during a layer, the engine's thread waited for
 * it at that layer's return). pools[i]: layer i's KV pool. Returns the failing layer's
 * decode_layer code, 0 when all went through. */
int decode_layers(const LayerShape *s, const LayerWeights *w, int layers, float *x, int rows,
                  int as_rows, const int64_t *positions, const float *cos, const float *sin,
                  const int64_t *block_tables, int table_width, void *const *pools,
                  int nthreads) {
    for (int i = 0; i < layers; i++) {
        int rc = decode_layer(s, w + i, x, rows, as_rows, positions, cos, sin, block_tables,
                              table_width, pools[i], nthreads);
        if (rc) return rc;
    }
    return 0;
}
