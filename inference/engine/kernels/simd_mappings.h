/* One vector of floats at the build's width, for kernels written once over it (in the
 * manner of ggml-cpu's simd-mappings.h): 512-bit (VL 16) where the build has AVX512F, else
 * 256-bit (VL 8). chunk_attention.c and decode_attention.c's passes use these; exp is
 * simd.h's one approximation (DEFINE_EXP) at either width. */
#ifndef CHATAPP_KERNELS_SIMD_MAPPINGS_H
#define CHATAPP_KERNELS_SIMD_MAPPINGS_H
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "simd.h"

#ifdef __AVX512F__
#define VL 16
typedef __m512 vec;
typedef __m512i ivec;
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec vset1(float x) { return _mm512_set1_ps(x); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec vexp(vec x) { return exp512(x); }
static inline ivec iload(const int32_t *p) { return _mm512_loadu_si512(p); }
/* -inf in the lanes whose position is before p (they do not see key p). */
static inline vec vmask_before(vec s, ivec pos, int p) {
    __mmask16 seen = _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(p));
    return _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), s);
}
typedef __mmask16 vmask;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
/* The first n lanes (all from n = VL on); a masked load gives 0 past them. */
static inline vmask vfirst(int n) { return first_lanes(n); }
static inline vec vload_first(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void vstore_first(float *p, vmask m, vec v) { _mm512_mask_storeu_ps(p, m, v); }
static inline vec vadd_first(vec acc, vmask m, vec v) { return _mm512_mask_add_ps(acc, m, acc, v); }
static inline float vreduce_add(vec v) { return _mm512_reduce_add_ps(v); }
static inline float vreduce_max(vec v) { return _mm512_reduce_max_ps(v); }
static inline vec vload_aligned(const float *p) { return _mm512_load_ps(p); }
static inline void vstore_aligned(float *p, vec v) { _mm512_store_ps(p, v); }
/* acc's lanes, the largest of them and v's in the first lanes m. */
static inline vec vmax_first(vec acc, vmask m, vec v) { return _mm512_mask_max_ps(acc, m, acc, v); }
/* VL elements of the KV pool from element i as floats (simd.h's kv_load8 at this width). */
static inline vec vkv_load(const void *base, size_t i, const int half) {
    return kv_load16(base, i, half);
}
/* VL vectors' sums in one vector (r[j] = the sum of a[j]'s elements): pairs, then quads
 * within 128-bit lanes, then across lanes, ~3 instructions a vector where a horizontal sum
 * each took ~8. */
static inline vec vsum_each(vec a[VL]) {
    __m512 b[8], c[4];
    for (int k = 0; k < 8; k++)
        b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]),
                             _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    for (int m = 0; m < 4; m++)
        c[m] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}
#else
#define VL 8
typedef __m256 vec;
typedef __m256i ivec;
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline vec vset1(float x) { return _mm256_set1_ps(x); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec vexp(vec x) { return exp256(x); }
static inline ivec iload(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vec vmask_before(vec s, ivec pos, int p) {
    __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(pos, _mm256_set1_epi32(p - 1)));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, seen);
}
typedef __m256i vmask;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vmask vfirst(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vec vload_first(const float *p, vmask m) { return _mm256_maskload_ps(p, m); }
static inline void vstore_first(float *p, vmask m, vec v) { _mm256_maskstore_ps(p, m, v); }
static inline vec vadd_first(vec acc, vmask m, vec v) {
    return _mm256_add_ps(acc, _mm256_and_ps(v, _mm256_castsi256_ps(m)));
}
static inline float vreduce_add(vec v) { return hsum256(v); }
static inline float vreduce_max(vec v) { return hmax256(v); }
static inline vec vload_aligned(const float *p) { return _mm256_load_ps(p); }
static inline void vstore_aligned(float *p, vec v) { _mm256_store_ps(p, v); }
static inline vec vmax_first(vec acc, vmask m, vec v) {
    const __m256 seen = _mm256_castsi256_ps(m);
    return _mm256_max_ps(acc, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, seen));
}
static inline vec vkv_load(const void *base, size_t i, const int half) {
    return kv_load8(base, i, half);
}
/* Pairs and quads by horizontal adds, then the two 128-bit halves, where a horizontal sum
 * a vector took ~5. */
static inline vec vsum_each(vec a[VL]) {
    const __m256 b0 = _mm256_hadd_ps(a[0], a[1]), b1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 b2 = _mm256_hadd_ps(a[4], a[5]), b3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 c0 = _mm256_hadd_ps(b0, b1), c1 = _mm256_hadd_ps(b2, b3);
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20),
                         _mm256_permute2f128_ps(c0, c1, 0x31));
}
#endif

#endif
