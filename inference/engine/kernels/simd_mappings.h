/* One vector of floats at the build's width, for kernels written once over it (in the
 * manner of ggml-cpu's simd-mappings.h): 512-bit (VL 16) where the build has AVX512F, else
 * 256-bit (VL 8). chunk_attention.c and decode_attention.c's passes use these; exp is
 * simd.h's one approximation at either width. */
#ifndef CHATAPP_KERNELS_SIMD_MAPPINGS_H
#define CHATAPP_KERNELS_SIMD_MAPPINGS_H
#include <immintrin.h>
#include <math.h>
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
#else
#define VL 8
typedef __m256 vec;
typedef __m256i ivec;
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline vec vset1(float x) { return _mm256_set1_ps(x); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
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
#endif

#endif
