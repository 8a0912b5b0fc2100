/* Attention of one sequence's chunk of rows over its paged context, as small matrix
 * products in registers (flash attention's tiling, for a CPU).
 *
 * Why: a follow-up question about a long document is a chunk of a few dozen rows over
 * thousands of cached positions. The torch path gathered the context out of the pool and ran
 * SDPA over it with a mask; both the gather and SDPA's kernel (~70 GFLOP/s on one core)
 * made turn 2 pay ~4x a turn without the document (python -m inference.bench.followup).
 * Here the context is read where it lies, block by block, once per tile of query lanes.
 *
 * A tile is up to TL (row, query head) lanes of one KV head, the lanes of two vectors:
 * the scores of KJ keys against all its lanes are 2 * KJ accumulators, each key element
 * broadcast once for both vectors; the values are folded in DI output dimensions at a time
 * the same way. Each lane sees the positions up to its own row's (causal within the chunk),
 * with the running softmax (maximum, sum, output rescaled as the maximum grows).
 *
 * Pool layout (model_runner.py): [2 * kv_heads, num_blocks, block_size, kv_row(head_dim)],
 * keys are heads [0, kv_heads), values the rest. Tiles run in the kernels' pool
 * (decode_attention.c). AVX512 where the build has it (16 lanes a vector), else AVX2 (8).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_attention.h"
#include "common.h"
#include "simd.h"
#include "simd_mappings.h"

#ifdef __AVX512F__
#define KJ 8 /* 16 score accumulators + 2 queries + a broadcast: 19 of 32 registers */
#define DI 8
#else
#define KJ 4 /* AVX2 has 16 registers: 8 accumulators + 2 queries + a broadcast */
#define DI 4
#endif

#define TL (2 * VL)
#define MAX_BLOCK 256 /* keys per paged block this kernel takes */

typedef struct {
    const ChunkShape *s;
    const float *qkv; /* [rows, heads + 2 * kv_heads, head_dim] */
    int rows;
    const int64_t *positions; /* [rows] */
    const int64_t *table;     /* the sequence's blocks, covering its longest position */
    int table_len;
    const void *pool;
    float *out; /* [rows, heads, head_dim] */
    int tiles;  /* per KV head */
} ChunkTask;

/* Block b's keys (kv = 0) or values (kv = 1) of KV head g, its first n rows, as float32:
 * in the pool where it is float32, else converted into buf (block_size * head_dim floats),
 * once for the tile's lanes. */
static inline const float *block_floats(const ChunkTask *t, int kv, int g, int b, int n,
                                        float *buf) {
    const ChunkShape *s = t->s;
    return kv_floats(t->pool, chunk_kv_at(s, kv, g, t->table[b], 0), n, s->head_dim, s->kv_type,
                     buf);
}

/* The tile's queries, transposed to [head_dim][TL] and scaled, and its lanes' positions.
 * Spare lanes repeat lane 0's row with a zero query: finite, then ignored. */
static void load_queries(const ChunkTask *t, int g, int first, int lanes, float *qt,
                         int32_t *pos, int *minpos, int *maxpos) {
    const ChunkShape *s = t->s;
    int d = s->head_dim, group = s->heads / s->kv_heads;
    int nqkv = (s->heads + 2 * s->kv_heads) * d;
    *minpos = INT32_MAX;
    *maxpos = 0;
    for (int l = 0; l < TL; l++) {
        int lane = first + (l < lanes ? l : 0);
        int r = lane / group, head = g * group + lane % group;
        const float *q = t->qkv + (size_t)r * nqkv + head * d;
        for (int i = 0; i < d; i++) qt[i * TL + l] = l < lanes ? q[i] * s->scale : 0.0f;
        pos[l] = (int32_t)t->positions[r];
        if (pos[l] < *minpos) *minpos = pos[l];
        if (pos[l] > *maxpos) *maxpos = pos[l];
    }
}

/* Each lane's output, divided by its softmax sum, to out[row][head]. */
static void write_out(const ChunkTask *t, int g, int first, int lanes, const float *acc,
                      vec sum0, vec sum1) {
    const ChunkShape *s = t->s;
    int d = s->head_dim, hq = s->heads, group = hq / s->kv_heads;
    float total[TL] __attribute__((aligned(64)));
    vstore(total, sum0);
    vstore(total + VL, sum1);
    for (int l = 0; l < lanes; l++) {
        int lane = first + l, r = lane / group, head = g * group + lane % group;
        float *o = t->out + ((size_t)r * hq + head) * d, inv = 1.0f / total[l];
        for (int i = 0; i < d; i++) o[i] = acc[i * TL + l] * inv;
    }
}

/* The scores of keys k[0..KJ) against the tile's queries, stored to sc[j * TL ...]. */
static inline __attribute__((always_inline)) void scores(const float *qt, const float *const k[KJ],
                                                         int d, float *sc) {
    vec s0[KJ], s1[KJ];
    for (int j = 0; j < KJ; j++) s0[j] = s1[j] = vset1(0.0f);
    for (int i = 0; i < d; i++) {
        vec q0 = vload(qt + i * TL), q1 = vload(qt + i * TL + VL);
        for (int j = 0; j < KJ; j++) {
            vec b = vset1(k[j][i]);
            s0[j] = vfma(q0, b, s0[j]);
            s1[j] = vfma(q1, b, s1[j]);
        }
    }
    for (int j = 0; j < KJ; j++) {
        vstore(sc + j * TL, s0[j]);
        vstore(sc + j * TL + VL, s1[j]);
    }
}

static void tile(void *arg, int index) {
    const ChunkTask *t = (const ChunkTask *)arg;
    const ChunkShape *s = t->s;
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    int group = hq / hkv, lanes_all = t->rows * group;
    /* The last tiles hold the latest rows, which see the most keys: they go first. */
    int g = index % hkv, first = (t->tiles - 1 - index / hkv) * TL;
    int lanes = lanes_all - first < TL ? lanes_all - first : TL;
    float qt[d * TL] __attribute__((aligned(64)));
    float acc[d * TL] __attribute__((aligned(64)));
    float kbuf[s->kv_type ? bs * d : 1], vbuf[s->kv_type ? bs * d : 1];
    float sc[(MAX_BLOCK + KJ) * TL] __attribute__((aligned(64)));
    int32_t pos[TL] __attribute__((aligned(64)));
    int minpos, maxpos;
    load_queries(t, g, first, lanes, qt, pos, &minpos, &maxpos);
    memset(acc, 0, sizeof(float) * d * TL);
    const ivec pos0 = iload(pos), pos1 = iload(pos + VL);
    const vec neg_inf = vset1(-INFINITY);
    vec m0 = neg_inf, m1 = neg_inf, sum0 = vset1(0.0f), sum1 = vset1(0.0f);
    int ctx = maxpos + 1;
    for (int b = 0; b * bs < ctx; b++) {
        int p0 = b * bs, nk = ctx - p0 < bs ? ctx - p0 : bs;
        int nj = (nk + KJ - 1) / KJ * KJ;
        const float *kb = block_floats(t, 0, g, b, nk, kbuf);
        const float *vb = block_floats(t, 1, g, b, nk, vbuf);
        for (int j0 = 0; j0 < nk; j0 += KJ) {
            const float *k[KJ];
            for (int j = 0; j < KJ; j++) k[j] = kb + (size_t)(j0 + j < nk ? j0 + j : nk - 1) * d;
            scores(qt, k, d, sc + j0 * TL);
            if (nk - j0 < KJ || p0 + j0 + KJ - 1 > minpos) {
                /* Some lane does not see some of these keys (or they are past nk). */
                for (int j = 0; j < KJ; j++) {
                    float *row = sc + (j0 + j) * TL;
                    if (j0 + j >= nk) {
                        vstore(row, neg_inf);
                        vstore(row + VL, neg_inf);
                    } else {
                        vstore(row, vmask_before(vload(row), pos0, p0 + j0 + j));
                        vstore(row + VL, vmask_before(vload(row + VL), pos1, p0 + j0 + j));
                    }
                }
            }
        }
        /* Key p0 <= every lane's own position in the first block, so the maxima are
         * finite from there on. */
        vec c0 = m0, c1 = m1;
        for (int j = 0; j < nj; j++) {
            c0 = vmax(c0, vload(sc + j * TL));
            c1 = vmax(c1, vload(sc + j * TL + VL));
        }
        vec a0 = vexp(vsub(m0, c0)), a1 = vexp(vsub(m1, c1));
        sum0 = vmul(sum0, a0);
        sum1 = vmul(sum1, a1);
        for (int j = 0; j < nj; j++) {
            vec e0 = vexp(vsub(vload(sc + j * TL), c0));
            vec e1 = vexp(vsub(vload(sc + j * TL + VL), c1));
            vstore(sc + j * TL, e0);
            vstore(sc + j * TL + VL, e1);
            sum0 = vadd(sum0, e0);
            sum1 = vadd(sum1, e1);
        }
        m0 = c0;
        m1 = c1;
        for (int i0 = 0; i0 < d; i0 += DI) {
            vec o0[DI], o1[DI];
            for (int i = 0; i < DI; i++) {
                o0[i] = vmul(vload(acc + (i0 + i) * TL), a0); /* rescaled as it is read */
                o1[i] = vmul(vload(acc + (i0 + i) * TL + VL), a1);
            }
            for (int j = 0; j < nk; j++) {
                vec e0 = vload(sc + j * TL), e1 = vload(sc + j * TL + VL);
                const float *v = vb + (size_t)j * d + i0;
                for (int i = 0; i < DI; i++) {
                    vec bv = vset1(v[i]);
                    o0[i] = vfma(e0, bv, o0[i]);
                    o1[i] = vfma(e1, bv, o1[i]);
                }
            }
            for (int i = 0; i < DI; i++) {
                vstore(acc + (i0 + i) * TL, o0[i]);
                vstore(acc + (i0 + i) * TL + VL, o1[i]);
            }
        }
    }
    write_out(t, g, first, lanes, acc, sum0, sum1);
}

#ifdef __AVX512BF16__
/* The same tile with its products in bfloat16: VDPBF16PS multiplies pairs of bf16 and adds
 * both products to a float32 lane, so each instruction does the work of two FMAs. Queries
 * and keys pair along head_dim (a key's row converts as it lies); weights and values pair
 * along the keys (two keys' rows interleaved: interleave_bf16). Sums, the softmax and the
 * output stay float32, as in flash attention on a GPU. */
static inline __m512 dpbf16(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

static void tile_bf16(void *arg, int index) {
    const ChunkTask *t = (const ChunkTask *)arg;
    const ChunkShape *s = t->s;
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    int group = hq / hkv, lanes_all = t->rows * group, d2 = d / 2;
    int g = index % hkv, first = (t->tiles - 1 - index / hkv) * TL;
    int lanes = lanes_all - first < TL ? lanes_all - first : TL;
    float qt[d * TL] __attribute__((aligned(64)));
    float kbuf[s->kv_type ? bs * d : 1], vbuf[s->kv_type ? bs * d : 1];
    uint32_t q2[d2 * TL] __attribute__((aligned(64)));          /* query pairs, per lane */
    float acc[d * TL] __attribute__((aligned(64)));
    float sc[(MAX_BLOCK + KJ) * TL] __attribute__((aligned(64)));
    uint32_t p2[(MAX_BLOCK / 2 + KJ) * TL] __attribute__((aligned(64))); /* weight pairs */
    uint32_t kq[KJ * d2] __attribute__((aligned(64)));           /* KJ keys as bf16 pairs */
    uint32_t v2[(MAX_BLOCK / 2 + 1) * d] __attribute__((aligned(64))); /* value pairs */
    int32_t pos[TL] __attribute__((aligned(64)));
    int minpos, maxpos;
    load_queries(t, g, first, lanes, qt, pos, &minpos, &maxpos);
    for (int i2 = 0; i2 < d2; i2++)
        for (int h = 0; h < 2; h++)
            _mm512_store_si512(q2 + i2 * TL + h * VL,
                               interleave_bf16(vload(qt + 2 * i2 * TL + h * VL),
                                               vload(qt + (2 * i2 + 1) * TL + h * VL)));
    memset(acc, 0, sizeof(float) * d * TL);
    const ivec pos0 = iload(pos), pos1 = iload(pos + VL);
    const vec neg_inf = vset1(-INFINITY);
    vec m0 = neg_inf, m1 = neg_inf, sum0 = vset1(0.0f), sum1 = vset1(0.0f);
    int ctx = maxpos + 1;
    for (int b = 0; b * bs < ctx; b++) {
        int p0 = b * bs, nk = ctx - p0 < bs ? ctx - p0 : bs;
        int nj = (nk + KJ - 1) / KJ * KJ;
        const float *kb = block_floats(t, 0, g, b, nk, kbuf);
        const float *vb = block_floats(t, 1, g, b, nk, vbuf);
        for (int j0 = 0; j0 < nk; j0 += KJ) {
            for (int j = 0; j < KJ; j++) {
                const float *k = kb + (size_t)(j0 + j < nk ? j0 + j : nk - 1) * d;
                for (int i = 0; i < d; i += 2 * VL)
                    _mm512_store_si512(kq + j * d2 + i / 2,
                                       (__m512i)_mm512_cvtne2ps_pbh(vload(k + i + VL), vload(k + i)));
            }
            vec s0[KJ], s1[KJ];
            for (int j = 0; j < KJ; j++) s0[j] = s1[j] = vset1(0.0f);
            for (int i2 = 0; i2 < d2; i2++) {
                __m512i a0 = _mm512_load_si512(q2 + i2 * TL), a1 = _mm512_load_si512(q2 + i2 * TL + VL);
                for (int j = 0; j < KJ; j++) {
                    __m512i bk = _mm512_set1_epi32((int)kq[j * d2 + i2]);
                    s0[j] = dpbf16(s0[j], a0, bk);
                    s1[j] = dpbf16(s1[j], a1, bk);
                }
            }
            for (int j = 0; j < KJ; j++) {
                float *row = sc + (j0 + j) * TL;
                int p = p0 + j0 + j;
                if (j0 + j >= nk) {
                    s0[j] = s1[j] = neg_inf;
                } else if (p > minpos) {
                    s0[j] = vmask_before(s0[j], pos0, p);
                    s1[j] = vmask_before(s1[j], pos1, p);
                }
                vstore(row, s0[j]);
                vstore(row + VL, s1[j]);
            }
        }
        vec c0 = m0, c1 = m1;
        for (int j = 0; j < nj; j++) {
            c0 = vmax(c0, vload(sc + j * TL));
            c1 = vmax(c1, vload(sc + j * TL + VL));
        }
        vec a0 = vexp(vsub(m0, c0)), a1 = vexp(vsub(m1, c1));
        sum0 = vmul(sum0, a0);
        sum1 = vmul(sum1, a1);
        int np = (nk + 1) / 2; /* key pairs; a pair's missing second key has weight 0 */
        for (int j2 = 0; j2 < np; j2++) {
            vec e[2][2];
            for (int u = 0; u < 2; u++) {
                e[u][0] = exp_bf16(vsub(vload(sc + (2 * j2 + u) * TL), c0));
                e[u][1] = exp_bf16(vsub(vload(sc + (2 * j2 + u) * TL + VL), c1));
                sum0 = vadd(sum0, e[u][0]);
                sum1 = vadd(sum1, e[u][1]);
            }
            _mm512_store_si512(p2 + j2 * TL, interleave_bf16(e[0][0], e[1][0]));
            _mm512_store_si512(p2 + j2 * TL + VL, interleave_bf16(e[0][1], e[1][1]));
        }
        m0 = c0;
        m1 = c1;
        for (int j2 = 0; j2 < np; j2++) {
            const float *va = vb + (size_t)(2 * j2) * d;
            const float *vc = 2 * j2 + 1 < nk ? va + d : va;
            for (int i = 0; i < d; i += VL)
                _mm512_store_si512(v2 + j2 * d + i, interleave_bf16(vload(va + i), vload(vc + i)));
        }
        for (int i0 = 0; i0 < d; i0 += DI) {
            vec o0[DI], o1[DI];
            for (int i = 0; i < DI; i++) {
                o0[i] = vmul(vload(acc + (i0 + i) * TL), a0); /* rescaled as it is read */
                o1[i] = vmul(vload(acc + (i0 + i) * TL + VL), a1);
            }
            for (int j2 = 0; j2 < np; j2++) {
                __m512i e0 = _mm512_load_si512(p2 + j2 * TL);
                __m512i e1 = _mm512_load_si512(p2 + j2 * TL + VL);
                for (int i = 0; i < DI; i++) {
                    __m512i bv = _mm512_set1_epi32((int)v2[j2 * d + i0 + i]);
                    o0[i] = dpbf16(o0[i], e0, bv);
                    o1[i] = dpbf16(o1[i], e1, bv);
                }
            }
            for (int i = 0; i < DI; i++) {
                vstore(acc + (i0 + i) * TL, o0[i]);
                vstore(acc + (i0 + i) * TL + VL, o1[i]);
            }
        }
    }
    write_out(t, g, first, lanes, acc, sum0, sum1);
}
#endif

/* out[r] = attention of row r's query heads over positions 0..positions[r] of the sequence
 * whose blocks are `table`; the rows' own K/V must be in the pool already. Returns 0, or -1
 * for a shape this kernel does not take (the caller keeps its other path), -2 for a
 * position past the table. */
int chunk_attention(const ChunkShape *s, const float *qkv, int rows, const int64_t *positions,
                    const int64_t *table, int table_len, const void *pool, float *out,
                    int nthreads) {
    if (rows <= 0) return 0;
    if (s->kv_heads <= 0 || s->heads % s->kv_heads || s->head_dim % DI || s->head_dim > 256 ||
        s->block_size <= 0 || s->block_size > MAX_BLOCK)
        return -1;
    for (int r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] / s->block_size >= table_len) return -2;
    for (int b = 0; b < table_len; b++)
        if (table[b] < 0 || table[b] >= s->num_blocks) return -2;
    /* With bf16 products, AMX's tiles where they run (chunk_attention_amx.c). */
    if (chunk_attention_amx(s, qkv, rows, positions, table, pool, out, nthreads) == 0) return 0;
    int group = s->heads / s->kv_heads, tiles = (rows * group + TL - 1) / TL;
    ChunkTask t = {s, qkv, rows, positions, table, table_len, pool, out, tiles};
    chunk_fn fn = tile;
#ifdef __AVX512BF16__
    if (s->bf16 && s->head_dim % (2 * VL) == 0) fn = tile_bf16;
#endif
    pool_run(fn, &t, tiles * s->kv_heads, nthreads);
    return 0;
}
