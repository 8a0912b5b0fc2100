/* The decode step's shapes (decode_attention.c, decode_layer.c; kernels/__init__.py's
 * LayerShape and LayerWeights mirror them). */
#ifndef CHATAPP_KERNELS_DECODE_H
#define CHATAPP_KERNELS_DECODE_H
#include <stdint.h>

#include "common.h"
#include "simd.h"

/* One of a layer's products in its own blocks: Q4_1 (a GGUF's Q4_K and Q5_K among them:
 * Q4Matrix), or Q8_0 (a GGUF's Q6_K among them: Q8Matrix), each by the product its format
 * has (formats/gguf_model.py's layer_formats says which). */
enum { LAYER_Q4_1 = 0, LAYER_Q8_0 = 1 };
typedef struct {
    int format; /* LAYER_Q4_1: q4 holds the matrix; LAYER_Q8_0: q8 */
    Q4Matrix q4;
    Q8Matrix q8;
} LayerMatrix;

typedef struct {
    const float *input_norm, *post_norm;
    /* Per-head RMS norms of q and of k after their product, before rope (Qwen3's); NULL:
     * none (Llama's). */
    const float *q_norm, *k_norm;
    /* The q/k/v product's bias, q's then k's then v's (Qwen2's); NULL: none. */
    const float *qkv_bias;
    LayerMatrix qkv, o, gate_up, down;
    /* Where q/k/v are two products of their own formats (a GGUF's q and k in Q4_K beside its
     * v in Q6_K): qkv's rows are q's and k's, qkv_v's the rest; qkv_split: qkv's rows (0:
     * qkv holds them all, qkv_v unused). */
    LayerMatrix qkv_v;
    int qkv_split;
} LayerWeights;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inter;
    float eps, scale;
    int block_size, num_blocks;  /* pool: [2 * kv_heads, num_blocks * block_size, kv_row] */
    int kv_type;                 /* the pool's elements: simd.h's KV_F32, KV_F16 or KV_I8 */
} LayerShape;

/* Elements of one KV head's keys (or values) in a layer's pool: its blocks' positions'
 * rows (simd.h's kv_row). */
static inline size_t kv_head_elems(const LayerShape *s) {
    return (size_t)s->num_blocks * s->block_size * kv_row(s->head_dim, s->kv_type);
}

/* The rows' attention over the pool (decode_attention.c); 0, or -1 out of memory. */
int decode_attention(const LayerShape *s, const float *qkv, int rows, const int64_t *positions,
                     const int64_t *block_tables, int table_width, const void *pool,
                     float *out, int nthreads);

#endif
