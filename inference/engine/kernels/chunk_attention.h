/* The prompts' chunk attention (chunk_attention.c, and its AMX tiles' build in
 * chunk_attention_amx.c): the shape both take, and the bf16 pieces they share. */
#ifndef CHATAPP_KERNELS_CHUNK_ATTENTION_H
#define CHATAPP_KERNELS_CHUNK_ATTENTION_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "simd.h"

typedef struct {
    int heads, kv_heads, head_dim, block_size, num_blocks;
    float scale;
    int kv_type; /* the pool's elements: simd.h's KV_F32, KV_F16 or KV_I8 */
    int bf16;    /* products in bfloat16 (float32 sums) where the build has AVX512-BF16 */
} ChunkShape;

/* The element offset of slot `slot` of pool block `block` of KV head g's keys (kv = 0) or
 * values (kv = 1): [2 * kv_heads, num_blocks, block_size, kv_row(head_dim)]. */
static inline size_t chunk_kv_at(const ChunkShape *s, int kv, int g, int64_t block, int slot) {
    return (((size_t)(kv * s->kv_heads + g) * s->num_blocks + (size_t)block) * s->block_size +
            (size_t)slot) *
           kv_row(s->head_dim, s->kv_type);
}

#ifdef __AVX512BF16__
static inline __m512i interleave_bf16(__m512 a, __m512 b) {
    /* 32-bit lanes (a[i], b[i]) as bf16 pairs, a in the low half. */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                         1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* exp(x) for x <= 0 to about bf16's precision (relative error ~1e-4): 2^(x log2 e) as 2^n
 * times a degree-4 polynomial of the fraction. Apart from simd.h's exp on purpose: the bf16
 * products round these weights to bf16 next, so exp's float precision (~1e-7, two more
 * terms) would be thrown away; the float32 products use vexp. */
static inline __m512 exp_bf16(__m512 x) {
    __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _mm512_set1_ps(-126.0f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n); /* [-0.5, 0.5] */
    __m512 p = _mm512_set1_ps(1.3333558e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    /* -inf (a masked key) gives t = -126 and a weight of ~1e-38 against a maximum of 1:
     * flushed below as 0 by the bf16 rounding of the tiny product. */
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ),
                               _mm512_scalef_ps(p, n));
}

#endif

/* chunk_attention's arguments, on AMX's tiles (chunk_attention_amx.c): 0, or -1 where it
 * does not run (no AMX, a shape it does not take, out of memory): the caller's tiles then. */
__attribute__((visibility("hidden"))) int chunk_attention_amx(const ChunkShape *s,
                                                              const float *qkv, int rows,
                                                              const int64_t *positions,
                                                              const int64_t *table,
                                                              const void *pool, float *out,
                                                              int nthreads);

#endif
