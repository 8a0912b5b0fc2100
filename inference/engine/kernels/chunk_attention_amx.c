/* The prompts' chunk attention on AMX's tiles: chunk_attention.c's bf16 products (queries,
 * keys, weights and values rounded to bf16, float32 sums), 16 x 16 x 32 an instruction.
 *
 * Why: a prompt's attention is as many products as its layers' weights at a few hundred
 * rows, and chunk_attention.c's AVX512-BF16 tiles took ~30% of a 512-token prefill on a
 * CPU whose AMX tiles ran the layers' products (perf of python -m
 * inference.bench.step_profile --prefill 512). Here a 512-row chunk takes ~0.3x their
 * time, 4 rows over 300 cached positions ~0.5x (python -m inference.bench.chunk_attention).
 *
 * Two steps, each over the kernels' pool:
 * 1. The context's keys and values, once for all of the chunk's query tiles, into the
 *    tiles' operand layouts in bf16: per 16 keys, their dims in pairs down the rows (the
 *    scores' B: a transpose), per 32 keys, their pairs down the rows (the output's B).
 * 2. Per KV head and 16 query lanes (a row's query heads of that KV head, rows in order):
 *    the scores of every key it sees (S = Q K^T on the tiles, into a buffer of
 *    lanes x context), each lane's softmax over its row in float32 (its maximum known
 *    before any weight is taken: no rescaling), the weights rounded to bf16, then the
 *    output O = P V on the tiles, held in four of them across the whole context.
 * The pool layout is chunk_attention.c's; each lane sees the positions up to its row's.
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_attention.h"
#include "common.h"
#include "simd.h"

#if HAVE_AMX
#define LANES 16 /* query lanes a tile: a tile's rows */

typedef struct {
    const ChunkShape *s;
    const float *qkv; /* [rows, heads + 2 * kv_heads, head_dim] */
    int rows;
    const int64_t *positions, *table;
    const void *pool;
    float *out;
    int ctx, ctx_pad; /* the positions any row sees; rounded up to 32 */
    int tiles;        /* query tiles per KV head */
    uint16_t *kt;     /* [kv_heads][ctx_pad / 16][head_dim / 32] tiles of keys' dim pairs */
    uint16_t *vp;     /* [kv_heads][ctx_pad / 32][head_dim / 16] tiles of values' key pairs */
    atomic_int failed;
} AmxAttnTask;

/* Position p's keys (kv = 0) or values (kv = 1) of KV head g into dst (head_dim floats). */
static void row_floats(const AmxAttnTask *t, int kv, int g, int p, float *dst) {
    const ChunkShape *s = t->s;
    const size_t at = chunk_kv_at(s, kv, g, t->table[p / s->block_size], p % s->block_size);
    const float *src = kv_floats(t->pool, at, 1, s->head_dim, s->kv_type, dst);
    if (src != dst) memcpy(dst, src, sizeof(float) * s->head_dim); /* a float32 pool's own */
}

/* Step 1, for KV head g and 32 positions (c = g's chunk of them): the scores' B tiles of
 * their two halves of 16 keys (row r, lane c: key c's dims 2r, 2r + 1 of each 32) and the
 * output's B tiles (row r, lane c: dim c of each 16, keys 2r and 2r + 1). Positions past
 * the context are zero (a zero key's score is masked; a zero value adds nothing). */
static void stage_kv(void *arg, int index) {
    const AmxAttnTask *t = (const AmxAttnTask *)arg;
    const int d = t->s->head_dim, d2 = d / 2, groups = t->ctx_pad / 32;
    const int g = index / groups, c = index % groups;
    float k[32][d] __attribute__((aligned(64)));
    float v[32][d] __attribute__((aligned(64)));
    uint32_t kw[32][d2] __attribute__((aligned(64))); /* each key's dims as bf16 pairs */
    for (int j = 0; j < 32; j++) {
        const int p = 32 * c + j;
        if (p >= t->ctx) {
            memset(k[j], 0, sizeof(float) * d);
            memset(v[j], 0, sizeof(float) * d);
            continue;
        }
        row_floats(t, 0, g, p, k[j]);
        row_floats(t, 1, g, p, v[j]);
    }
    for (int j = 0; j < 32; j++)
        for (int i = 0; i < d; i += 32)
            _mm512_store_si512(kw[j] + i / 2, (__m512i)_mm512_cvtne2ps_pbh(
                                                  _mm512_load_ps(k[j] + i + 16),
                                                  _mm512_load_ps(k[j] + i)));
    const __m512i across = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(d2));
    for (int h = 0; h < 2; h++) {
        const size_t kg = (size_t)g * (t->ctx_pad / 16) + 2 * (size_t)c + h;
        for (int e = 0; e < d / 32; e++) {
            uint32_t *tile = (uint32_t *)(t->kt + (kg * (d / 32) + e) * 512);
            for (int r = 0; r < 16; r++)
                _mm512_store_si512(tile + 16 * r,
                                   _mm512_i32gather_epi32(across, kw[16 * h] + 16 * e + r, 4));
        }
    }
    const size_t vg = (size_t)g * groups + c;
    for (int q = 0; q < d / 16; q++) {
        uint32_t *tile = (uint32_t *)(t->vp + (vg * (d / 16) + q) * 512);
        for (int r = 0; r < 16; r++)
            _mm512_store_si512(tile + 16 * r, interleave_bf16(_mm512_load_ps(v[2 * r] + 16 * q),
                                                              _mm512_load_ps(v[2 * r + 1] + 16 * q)));
    }
}

/* Each thread's scores (lanes x context, float32) and weights (bf16), grown as needed. */
static __thread float *tls_sc;
static __thread uint16_t *tls_p;
static __thread size_t tls_cap;

/* Step 2, for KV head g and one tile of query lanes (the latest rows first: they see the
 * most keys). */
static void attend_tile(void *arg, int index) {
    AmxAttnTask *t = (AmxAttnTask *)arg;
    const ChunkShape *s = t->s;
    const int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, group = hq / hkv;
    const int g = index % hkv, first = (t->tiles - 1 - index / hkv) * LANES;
    const int lanes_all = t->rows * group;
    const int lanes = lanes_all - first < LANES ? lanes_all - first : LANES;
    const int nqkv = (hq + 2 * hkv) * d;
    uint16_t qa[d / 32][LANES][32] __attribute__((aligned(64))); /* the queries, A tiles */
    float o[LANES][d] __attribute__((aligned(64)));
    float total[LANES];
    int pos[LANES], maxpos = 0;
    for (int l = 0; l < LANES; l++) {
        const int lane = first + l, r = lane / group, head = g * group + lane % group;
        const float *q = t->qkv + (size_t)r * nqkv + head * d;
        pos[l] = l < lanes ? (int)t->positions[r] : -1;
        if (pos[l] > maxpos) maxpos = pos[l];
        for (int i = 0; i < d; i += 32) {
            __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
            if (l < lanes) {
                a = _mm512_mul_ps(_mm512_loadu_ps(q + i), _mm512_set1_ps(s->scale));
                b = _mm512_mul_ps(_mm512_loadu_ps(q + i + 16), _mm512_set1_ps(s->scale));
            }
            _mm512_store_si512(qa[i / 32][l], (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
    const int n = (maxpos + 1 + 31) / 32 * 32; /* the keys this tile reads */
    const size_t need = (size_t)LANES * n;
    if (tls_cap < need) {
        free(tls_sc);
        free(tls_p);
        tls_sc = (float *)aligned_alloc(64, need * sizeof(float));
        tls_p = (uint16_t *)aligned_alloc(64, need * sizeof(uint16_t));
        tls_cap = tls_sc && tls_p ? need : 0;
        if (!tls_cap) {
            atomic_store(&t->failed, 1);
            return;
        }
    }
    float *sc = tls_sc;
    uint16_t *pw = tls_p;
    amx_configure();
    /* Scores: tiles 3, 4 for the 32 keys' two halves; 0 the queries' dims; 1, 2 the keys'. */
    const size_t kt0 = (size_t)g * (t->ctx_pad / 16) * (d / 32);
    for (int c = 0; c < n / 32; c++) {
        _tile_zero(3);
        _tile_zero(4);
        for (int e = 0; e < d / 32; e++) {
            _tile_loadd(0, qa[e], 64);
            _tile_loadd(1, t->kt + (kt0 + (size_t)(2 * c) * (d / 32) + e) * 512, 64);
            _tile_loadd(2, t->kt + (kt0 + (size_t)(2 * c + 1) * (d / 32) + e) * 512, 64);
            _tile_dpbf16ps(3, 0, 1);
            _tile_dpbf16ps(4, 0, 2);
        }
        _tile_stored(3, sc + 32 * c, (long)n * sizeof(float));
        _tile_stored(4, sc + 32 * c + 16, (long)n * sizeof(float));
    }
    /* Each lane's softmax: its keys past its own position masked, its maximum, then the
     * weights in bf16 (float32 sums). Spare lanes weigh nothing. */
    for (int l = 0; l < LANES; l++) {
        float *row = sc + (size_t)l * n;
        uint16_t *pr = pw + (size_t)l * n;
        if (l >= lanes) {
            memset(pr, 0, sizeof(uint16_t) * n);
            continue;
        }
        const int seen = pos[l] + 1;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < n; j += 16) {
            __m512 x = _mm512_load_ps(row + j);
            if (j + 16 > seen) {
                x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), first_lanes(seen - j > 0 ? seen - j : 0), x);
                _mm512_store_ps(row + j, x);
            }
            mx = _mm512_max_ps(mx, x);
        }
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 32) {
            const __m512 e0 = exp_bf16(_mm512_sub_ps(_mm512_load_ps(row + j), m));
            const __m512 e1 = exp_bf16(_mm512_sub_ps(_mm512_load_ps(row + j + 16), m));
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            _mm512_store_si512(pr + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        }
        total[l] = _mm512_reduce_add_ps(sum);
    }
    /* The output, 64 dims at a time: tiles 4-7 its 16-dim quarters; 0 the weights of 32
     * keys, 1 and 2 their values in turn. */
    const size_t vp0 = (size_t)g * (t->ctx_pad / 32) * (d / 16);
    for (int i0 = 0; i0 < d; i0 += 64) {
        const int quarters = d - i0 < 64 ? (d - i0) / 16 : 4;
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        for (int c = 0; c < n / 32; c++) {
            const uint16_t *v = t->vp + (vp0 + (size_t)c * (d / 16) + i0 / 16) * 512;
            _tile_loadd(0, pw + 32 * c, (long)n * sizeof(uint16_t));
            _tile_loadd(1, v, 64);
            _tile_dpbf16ps(4, 0, 1);
            _tile_loadd(2, v + 512, 64);
            _tile_dpbf16ps(5, 0, 2);
            if (quarters > 2) {
                _tile_loadd(1, v + 1024, 64);
                _tile_dpbf16ps(6, 0, 1);
                _tile_loadd(2, v + 1536, 64);
                _tile_dpbf16ps(7, 0, 2);
            }
        }
        _tile_stored(4, o[0] + i0, (long)d * sizeof(float));
        _tile_stored(5, o[0] + i0 + 16, (long)d * sizeof(float));
        if (quarters > 2) {
            _tile_stored(6, o[0] + i0 + 32, (long)d * sizeof(float));
            _tile_stored(7, o[0] + i0 + 48, (long)d * sizeof(float));
        }
    }
    _tile_release();
    for (int l = 0; l < lanes; l++) {
        const int lane = first + l, r = lane / group, head = g * group + lane % group;
        float *out = t->out + ((size_t)r * hq + head) * d;
        const __m512 inv = _mm512_set1_ps(1.0f / total[l]);
        for (int i = 0; i < d; i += 16)
            _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_load_ps(o[l] + i), inv));
    }
}
#endif

/* Whether chunks take the tiles where they run: cpu_backend.py's choice (kernels.load). */
static int chunk_amx;

void set_chunk_amx(int on) { chunk_amx = on; }

int chunk_attention_amx(const ChunkShape *s, const float *qkv, int rows, const int64_t *positions,
                        const int64_t *table, const void *pool, float *out, int nthreads) {
#if HAVE_AMX
    if (!chunk_amx || !s->bf16 || s->head_dim % 32 || !amx_ready()) return -1;
    int ctx = 0;
    for (int r = 0; r < rows; r++)
        if (positions[r] + 1 > ctx) ctx = (int)positions[r] + 1;
    const int ctx_pad = (ctx + 31) / 32 * 32, group = s->heads / s->kv_heads;
    const size_t elems = (size_t)s->kv_heads * ctx_pad * s->head_dim;
    /* The staged keys and values in the calling thread's buffer, kept for its next call:
     * allocated and freed each call, a long context's were fresh pages every layer. */
    static __thread uint16_t *staged;
    static __thread size_t staged_cap;
    if (staged_cap < 2 * elems) {
        free(staged);
        staged = (uint16_t *)aligned_alloc(64, 2 * elems * sizeof(uint16_t));
        staged_cap = staged ? 2 * elems : 0;
        if (!staged) return -1;
    }
    AmxAttnTask t = {s, qkv, rows, positions, table, pool, out, ctx, ctx_pad,
                     (rows * group + LANES - 1) / LANES, staged, staged + elems, 0};
    pool_run(stage_kv, &t, s->kv_heads * (ctx_pad / 32), nthreads);
    pool_run(attend_tile, &t, t.tiles * s->kv_heads, nthreads);
    return atomic_load(&t.failed) ? -1 : 0;
#else
    (void)s, (void)qkv, (void)rows, (void)positions, (void)table, (void)pool, (void)out,
        (void)nthreads;
    return -1;
#endif
}
