/* Attention of a step's decode rows, guesses and short chunks over the paged KV pool:
 * decode_attention (the native path's layers) and paged_attention (the torch path's). */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "decode.h"
#include "simd.h"
#include "simd_mappings.h"

/* A float dot product: -O3 alone keeps a reduction scalar (it may not reorder the sum),
 * which made attention over a long context the slowest part of a decode step. */
static inline float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* The ctx scores in place to exp(score - max) (mx: the scores' maximum in each lane);
 * returns 1 / their sum. Either width's passes. */
static inline float exp_scores(float *scores, int ctx, vec mx) {
    const vec mxv = vset1(vreduce_max(mx));
    vec sum = vzero();
    for (int p0 = 0; p0 < ctx; p0 += VL) {
        const vmask m = vfirst(ctx - p0);
        const vec e = vexp(vsub(vload_first(scores + p0, m), mxv));
        vstore_first(scores + p0, m, e);
        sum = vadd_first(sum, m, e);
    }
    return 1.0f / vreduce_add(sum);
}

/* The attention's work items: a row's query heads of one KV head, one after the other
 * (each vectorized over head_dim), so the keys and values come from memory once for them:
 * an item per query head had both cores read them, and at 64 decode rows over ~145
 * positions of distinct contexts attention was ~half a native step (python -m
 * inference.bench.attention). Rows go one by one, also a sequence's several rows (its
 * speculative guesses, a prompt's last few tokens): a row's output is then the same bits
 * whatever rows come with it, so greedy speculation keeps plain decoding's text (a tile of
 * a sequence's rows would read each key once for them but sum in another order). Chunks of
 * more than a few rows take chunk_attention.c. */
typedef struct {
    int row;
    int head; /* a query head; -1: the row's query heads of KV head g */
    int g;
} AttnItem;

typedef struct {
    const LayerShape *s;
    const float *qkv;
    float *attn;
    const int64_t *positions, *block_tables;
    int table_width;
    const void *pool;
    const AttnItem *items;
    int ahead; /* the passes fetch the pool ahead a position at a time, else a block */
    atomic_int failed;
} AttnTask;

/* fn(..., type) for the pool's element type (simd.h's KV_*): each type its own inlined
 * build of the attention passes (their last argument, a constant there). */
#define BY_KV_TYPE(s, fn, ...)                                                   \
    ((s)->kv_type == KV_I8   ? fn(__VA_ARGS__, KV_I8)                           \
     : (s)->kv_type == KV_F16 ? fn(__VA_ARGS__, KV_F16)                         \
                              : fn(__VA_ARGS__, KV_F32))

/* The first K/V element of KV head g's keys (kv = 0) or values (kv = 1) in a layer's pool. */
static inline const void *kv_head(const LayerShape *s, const void *pool, int kv, int g) {
    return (const char *)pool +
           (size_t)(kv * s->kv_heads + g) * kv_head_elems(s) * kv_elem(s->kv_type);
}

/* Each thread's scores, grown to the longest context it has seen. */
static __thread float *tls_scores;
static __thread int tls_scores_cap;

/* As a row's keys reach block blk: the next block's keys into L1 and this block's values
 * into L2, all at once. Steps of fewer than PREFETCH_MIN_ROWS rows keep fetching ahead this
 * way: their few chats' K/V stays in the caches more and a position at a time showed no
 * gain there; from 4 rows over scattered blocks it takes ~0.65x the time (python -m
 * inference.bench.attention). */
#define PREFETCH_MIN_ROWS 4

static inline void prefetch_blocks(const LayerShape *s, int ctx, const int64_t *table, int blk,
                                   const void *keys, const void *vals) {
    const size_t bytes = kv_elem(s->kv_type) * s->block_size * kv_row(s->head_dim, s->kv_type);
    const char *v = (const char *)vals + (size_t)table[blk] * bytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(v + l, _MM_HINT_T1);
    if ((blk + 1) * s->block_size >= ctx) return;
    const char *k = (const char *)keys + (size_t)table[blk + 1] * bytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(k + l, _MM_HINT_T0);
}

/* Elements [from, from + n) of block blk's position slot into L1 (or L2, l2 = 1), where the
 * context reaches it. The passes fetch ahead a position at a time, as they reach the same
 * slot of the block before: the keys' next block into L1 and this block's values into L2
 * in the pass over keys, the values' next block into L1 in theirs. A block is a page of its
 * own (16 positions of head_dim 64, 2 KB of float16) and chats' blocks lie scattered, so
 * the hardware's prefetchers, which stop at a page's end, start cold at every block; and a
 * whole block's lines asked for at once, at its first position, waited behind each other
 * (64 decode rows over 300 scattered positions of a float16 pool: ~0.65x the time spread
 * out this way; python -m inference.bench.attention). */
static inline __attribute__((always_inline)) void prefetch_position(
    const LayerShape *s, int ctx, const int64_t *table, int blk, int slot, const void *base,
    int from, int n, const int l2, const int H) {
    const int bs = s->block_size;
    if (blk * bs + slot >= ctx) return;
    const size_t e = kv_elem(H);
    const char *p =
        (const char *)base + (((size_t)table[blk] * bs + slot) * kv_row(s->head_dim, H) + from) * e;
    /* An int8 row's scale after its values; its first and last byte's lines both. */
    const size_t bytes = (size_t)n * e + (H == KV_I8 ? sizeof(float) : 0);
    for (size_t l = 0; l < bytes + 63; l += 64) {
        const char *at = p + (l < bytes ? l : bytes - 1);
        if (l2)
            _mm_prefetch(at, _MM_HINT_T1);
        else
            _mm_prefetch(at, _MM_HINT_T0);
    }
}

/* What a pass over the keys fetches as it reaches position `slot` of block blk: the next
 * block's key and this block's value at that slot (ahead), else both blocks whole at a
 * block's first position (prefetch_blocks). */
static inline __attribute__((always_inline)) void prefetch_for_keys(
    const LayerShape *s, int ctx, const int64_t *table, int blk, int slot, const void *keys,
    const void *vals, const int ahead, const int H) {
    if (ahead) {
        prefetch_position(s, ctx, table, blk + 1, slot, keys, 0, s->head_dim, 0, H);
        prefetch_position(s, ctx, table, blk, slot, vals, 0, s->head_dim, 1, H);
    } else if (slot == 0) {
        prefetch_blocks(s, ctx, table, blk, keys, vals);
    }
}

/* The decode passes, written once over the build's vector width (simd_mappings.h: VL
 * floats a vector, VREGS registers). Where the two widths were tuned apart, the choice is
 * one of these constants of the width, not a second copy of the pass:
 *
 * KEYS_HELD: a position's keys (head_dim / VL vectors, at most 4 here) are loaded once into
 * registers for all G heads, each head's scores summed position by position. With 16
 * registers the G heads' accumulators would not fit beside them: the 256-bit pass goes head
 * by head instead, VL positions' keys each (a float16 pool's converted once into kf for
 * the G heads: converted for each head, the conversions bound the pass, ~0.7x the time
 * converted once; python -m inference.bench.attention, AVX2 build).
 *
 * VALUE_SUMS: the weighted values' accumulators a slice of head_dim holds (G heads' sums
 * of NC vectors each); the passes over the values go slice by slice.
 *
 * TWO_CHAINS: a single head's weighted values summed over even and odd positions apart,
 * two chains of adds where one head's few accumulators would wait on each other (512-bit,
 * head_dim up to 128 in 8 vectors). */
#if VL == 16
#define KEYS_HELD 1
#define VALUE_SUMS 16
#define TWO_CHAINS 1
#else
#define KEYS_HELD 0
#define VALUE_SUMS 12
#define TWO_CHAINS 0
#endif

/* A head's VL positions' scores (acc[j]: position j's products, summed across lanes here)
 * scaled into scores (its first n lanes) and into the head's running maximum. */
static inline __attribute__((always_inline)) void store_scores(vec acc[VL], vec scale, vmask m,
                                                               float *scores, vec *mx) {
    const vec sc = vmul(vsum_each(acc), scale);
    vstore_first(scores, m, sc);
    *mx = vmax_first(*mx, m, sc);
}

/* sums[h][c] += position p's weight of head h times its values' slice (v: the slice's
 * first element; w: position p's weight of head 0, heads ctx apart). Each value loaded
 * once for the G heads where `load_once`, else once a head (from L1: the G weights then
 * need no registers of their own). */
static inline __attribute__((always_inline)) void add_values(vec sums[4][8], const float *w,
                                                             int ctx, const void *vals,
                                                             size_t v, float vs, const int G,
                                                             const int NC, const int load_once,
                                                             const int H) {
    if (load_once) {
        vec wh[4];
        for (int h = 0; h < G; h++) wh[h] = vset1(w[h * ctx] * vs);
        for (int c = 0; c < NC; c++) {
            const vec vc = vkv_load(vals, v + VL * c, H);
            for (int h = 0; h < G; h++) sums[h][c] = vfma(wh[h], vc, sums[h][c]);
        }
        return;
    }
    for (int h = 0; h < G; h++) {
        const vec wh = vset1(w[h * ctx] * vs);
        for (int c = 0; c < NC; c++)
            sums[h][c] = vfma(wh, vkv_load(vals, v + VL * c, H), sums[h][c]);
    }
}

/* A decode row's G query heads of one KV head over its positions (d = VL * ND): VL
 * positions' scores of a head reduced together (vsum_each) where a horizontal sum each
 * and a scalar exponential each had taken most of the time; the keys and values read from
 * memory once for the G heads (attention head after head read them from memory for the
 * first and from the caches for the others: at 64 rows of 300 positions over scattered
 * blocks ~0.9x of that, the cached case unchanged; python -m inference.bench.attention);
 * the blocks fetched ahead (prefetch_position). The exponentials VL at a time
 * (exp_scores). scores: G * ctx floats; q and o: the G heads' queries and outputs, d apart.
 * The scores are the same dot products summed in another order. */
static inline __attribute__((always_inline)) void attention_group_n(
    const LayerShape *s, int ctx, const float *qp, const int64_t *table, const void *keys,
    const void *vals, float *scores, float *o, const int G, const int ND, const int ahead,
    const int H) {
    const int d = s->head_dim, bs = s->block_size;
    const size_t R = kv_row(d, H); /* a position's row */
    const vec scale = vset1(s->scale);
    vec mx[4], q[4][KEYS_HELD ? 8 : 1];
    for (int h = 0; h < G; h++) {
        mx[h] = vset1(-INFINITY);
        if (KEYS_HELD)
            for (int c = 0; c < ND; c++) q[h][c] = vload(qp + h * d + VL * c);
    }
    /* The keys converted once (and scaled, an int8 pool's) for the G heads. */
    const int convert = H == KV_I8 || (H == KV_F16 && G > 1);
    float kf[H && !KEYS_HELD ? VL * VL * ND : 1] __attribute__((aligned(64)));
    /* The position's block and slot advance together: no division a position. */
    int blk = 0, slot = 0;
    for (int p0 = 0; p0 < ctx; p0 += VL) {
        const int n = ctx - p0 < VL ? ctx - p0 : VL;
        const vmask m = vfirst(n);
        if (KEYS_HELD) {
            vec acc[4][VL];
            for (int j = 0; j < VL; j++) {
                if (j >= n) {
                    for (int h = 0; h < G; h++) acc[h][j] = vzero();
                    continue;
                }
                const size_t k = ((size_t)table[blk] * bs + slot) * R;
                prefetch_for_keys(s, ctx, table, blk, slot, keys, vals, ahead, H);
                vec kv[8];
                for (int c = 0; c < ND; c++) kv[c] = vkv_load(keys, k + VL * c, H);
                const vec ks = vset1(H == KV_I8 ? kv_scale(keys, k, d) : 1.0f);
                for (int h = 0; h < G; h++) {
                    vec a = vmul(q[h][0], kv[0]);
                    for (int c = 1; c < ND; c++) a = vfma(q[h][c], kv[c], a);
                    acc[h][j] = H == KV_I8 ? vmul(a, ks) : a;
                }
                if (++slot == bs) slot = 0, blk++;
            }
            for (int h = 0; h < G; h++)
                store_scores(acc[h], scale, m, scores + h * ctx + p0, &mx[h]);
            continue;
        }
        size_t kp[VL];
        for (int j = 0; j < VL; j++) {
            if (j >= n) {
                kp[j] = kp[0]; /* a lane past the context: computed, then masked */
                continue;
            }
            prefetch_for_keys(s, ctx, table, blk, slot, keys, vals, ahead, H);
            kp[j] = ((size_t)table[blk] * bs + slot) * R;
            if (++slot == bs) slot = 0, blk++;
        }
        if (convert)
            for (int j = 0; j < VL; j++) {
                const vec ks = vset1(H == KV_I8 ? kv_scale(keys, kp[j], d) : 1.0f);
                for (int c = 0; c < ND; c++)
                    vstore_aligned(kf + (j * ND + c) * VL, vmul(vkv_load(keys, kp[j] + VL * c, H), ks));
            }
        for (int h = 0; h < G; h++) {
            vec acc[VL];
            for (int j = 0; j < VL; j++) acc[j] = vzero();
            for (int c = 0; c < ND; c++) {
                const vec qc = vload(qp + h * d + VL * c);
                for (int j = 0; j < VL; j++)
                    acc[j] = vfma(qc,
                                  convert ? vload_aligned(kf + (j * ND + c) * VL)
                                             : vkv_load(keys, kp[j] + VL * c, H),
                                  acc[j]);
            }
            store_scores(acc, scale, m, scores + h * ctx + p0, &mx[h]);
        }
    }
    float inv[4];
    for (int h = 0; h < G; h++) inv[h] = exp_scores(scores + h * ctx, ctx, mx[h]);
    /* A slice of NC vectors: G * NC sums, at most VALUE_SUMS (a power of two per head). */
    const int per_head = VALUE_SUMS / G >= 8 ? 8 : VALUE_SUMS / G >= 4 ? 4 : 2;
    const int NC = ND < per_head ? ND : per_head;
    const int chains = TWO_CHAINS && G == 1 ? 2 : 1;
    /* A value converted (a float16 pool) is converted once; with 32 registers the G
     * weights fit beside the sums. */
    const int load_once = H || KEYS_HELD;
    for (int c0 = 0; c0 < ND; c0 += NC) {
        vec out[2][4][8];
        for (int e = 0; e < chains; e++)
            for (int h = 0; h < G; h++)
                for (int c = 0; c < NC; c++) out[e][h][c] = vzero();
        blk = 0;
        slot = 0;
        for (int p = 0; p < ctx; p++) {
            const size_t row = ((size_t)table[blk] * bs + slot) * R, v = row + VL * c0;
            const float vs = H == KV_I8 ? kv_scale(vals, row, d) : 1.0f;
            if (ahead)
                prefetch_position(s, ctx, table, blk + 1, slot, vals, VL * c0, VL * NC, 0, H);
            else if (!KEYS_HELD && slot == 0)
                for (int j = 0; j < bs; j++)
                    prefetch_position(s, ctx, table, blk + 1, j, vals, VL * c0, VL * NC, 0, H);
            /* Each chain's own call: constant indices keep the sums in registers. */
            if (chains == 2 && (p & 1))
                add_values(out[1], scores + p, ctx, vals, v, vs, G, NC, load_once, H);
            else
                add_values(out[0], scores + p, ctx, vals, v, vs, G, NC, load_once, H);
            if (++slot == bs) slot = 0, blk++;
        }
        for (int h = 0; h < G; h++)
            for (int c = 0; c < NC; c++)
                vstore(o + h * d + VL * (c0 + c),
                       vmul(chains == 2 ? vadd(out[0][h][c], out[1][h][c]) : out[0][h][c],
                            vset1(inv[h])));
    }
}

/* attention_group_n for the shapes it is built for; returns 0 for others. 512-bit: a
 * single head of head_dim 16 to 128 (a multiple of 16), 2 to 4 heads of head_dim 16, 32 or
 * 64. 256-bit: 1 to 4 heads of head_dim 8, 16, 32, 64 or 128. */
static int attention_group_shape(const LayerShape *s, int G, int ctx, const float *q,
                                 const int64_t *table, const void *keys, const void *vals,
                                 float *scores, float *o, int ahead) {
#define GROUP_CASE(g, nd)                                                                  \
    case (g) * 32 + (nd):                                                                 \
        BY_KV_TYPE(s, attention_group_n, s, ctx, q, table, keys, vals, scores, o, g, nd, \
                   ahead);                                                                \
        return 1;
#if VL == 16
#define GROUP_CASES                                                                         \
    GROUP_CASE(1, 1) GROUP_CASE(1, 2) GROUP_CASE(1, 3) GROUP_CASE(1, 4) GROUP_CASE(1, 5)   \
    GROUP_CASE(1, 6) GROUP_CASE(1, 7) GROUP_CASE(1, 8)                                     \
    GROUP_CASE(2, 1) GROUP_CASE(3, 1) GROUP_CASE(4, 1) GROUP_CASE(2, 2) GROUP_CASE(3, 2)   \
    GROUP_CASE(4, 2) GROUP_CASE(2, 4) GROUP_CASE(3, 4) GROUP_CASE(4, 4)
#else
#define GROUP_ND(g) \
    GROUP_CASE(g, 1) GROUP_CASE(g, 2) GROUP_CASE(g, 4) GROUP_CASE(g, 8) GROUP_CASE(g, 16)
#define GROUP_CASES GROUP_ND(1) GROUP_ND(2) GROUP_ND(3) GROUP_ND(4)
#endif
    if (s->head_dim % VL || G < 1 || G > 4) return 0;
    switch (G * 32 + s->head_dim / VL) {
        GROUP_CASES
    }
#undef GROUP_CASES
#undef GROUP_ND
#undef GROUP_CASE
    return 0;
}

/* Each thread's scores for n positions, grown to the most it has seen; NULL (and the task
 * marked failed) where memory runs out. */
static float *scores_for(AttnTask *t, int n) {
    if (n > tls_scores_cap) {
        float *grown = realloc(tls_scores, sizeof(float) * (size_t)n);
        if (!grown) {
            atomic_store(&t->failed, 1);
            return NULL;
        }
        tls_scores = grown;
        tls_scores_cap = n;
    }
    return tls_scores;
}

/* One row's query head over the positions up to its own. */
static void attention_single(AttnTask *t, int r, int head) {
    const LayerShape *s = t->s;
    int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    int nqkv = (hq + 2 * hkv) * d;
    int ctx = (int)t->positions[r] + 1;
    float *scores = scores_for(t, ctx);
    if (!scores) return;
    const float *q = t->qkv + (size_t)r * nqkv + head * d;
    const int64_t *table = t->block_tables + (size_t)r * t->table_width;
    int g = head / (hq / hkv);
    const void *keys = kv_head(s, t->pool, 0, g), *vals = kv_head(s, t->pool, 1, g);
    const int type = s->kv_type;
    const size_t R = kv_row(d, type); /* a position's row */
    float *o = t->attn + ((size_t)r * hq + head) * d;
    if (attention_group_shape(s, 1, ctx, q, table, keys, vals, scores, o, t->ahead)) return;
    /* Positions go by block (a slot's `p / bs` and `p % bs` are integer divisions here). */
    float mx = -INFINITY, row[d];
    for (int p0 = 0; p0 < ctx; p0 += bs) {
        const size_t kb = (size_t)table[p0 / bs] * bs * R;
        const int n = ctx - p0 < bs ? ctx - p0 : bs;
        for (int j = 0; j < n; j++) {
            const float *k = kv_floats(keys, kb + (size_t)j * R, 1, d, type, row);
            const float sc = dot_f32(q, k, d) * s->scale;
            scores[p0 + j] = sc;
            mx = sc > mx ? sc : mx;
        }
    }
    float sum = 0.0f;
    for (int p = 0; p < ctx; p++) {
        scores[p] = expf(scores[p] - mx);
        sum += scores[p];
    }
    const float inv = 1.0f / sum;
    if (d % 8) {
        for (int i = 0; i < d; i++) o[i] = 0.0f;
        for (int p = 0; p < ctx; p++) {
            const float *v = kv_floats(vals, (table[p / bs] * bs + p % bs) * R, 1, d, type, row);
            for (int i = 0; i < d; i++) o[i] += scores[p] * inv * v[i];
        }
        return;
    }
    /* The weighted sum of values in registers, up to 64 of head_dim at a time: summed in
     * place in o, each position's adds waited for the previous position's stores (half of
     * a decode step's attention). */
    for (int i0 = 0; i0 < d; i0 += 64) {
        const int nv = (d - i0 < 64 ? d - i0 : 64) / 8;
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int p0 = 0; p0 < ctx; p0 += bs) {
            const size_t vb = (size_t)table[p0 / bs] * bs * R;
            const int n = ctx - p0 < bs ? ctx - p0 : bs;
            for (int j = 0; j < n; j++) {
                const size_t v = vb + (size_t)j * R;
                const float vs = type == KV_I8 ? kv_scale(vals, v, d) : 1.0f;
                const __m256 w = _mm256_set1_ps(scores[p0 + j] * vs);
                for (int c = 0; c < 8; c++)
                    if (c < nv)
                        acc[c] = _mm256_fmadd_ps(w, kv_load8(vals, v + i0 + 8 * c, type), acc[c]);
            }
        }
        for (int c = 0; c < nv; c++)
            _mm256_storeu_ps(o + i0 + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
    }
}

/* Row r's query heads of KV head g in one pass (attention_group_n), where built for their
 * shape; 0 where not (or memory ran out: the task is then marked failed). */
static int attention_group(AttnTask *t, int r, int g, int group) {
    const LayerShape *s = t->s;
    const int d = s->head_dim, hq = s->heads, hkv = s->kv_heads;
    const int ctx = (int)t->positions[r] + 1;
    float *scores = scores_for(t, group * ctx);
    if (!scores) return 1;
    const float *q = t->qkv + (size_t)r * (hq + 2 * hkv) * d + (size_t)g * group * d;
    return attention_group_shape(
        s, group, ctx, q, t->block_tables + (size_t)r * t->table_width,
        kv_head(s, t->pool, 0, g), kv_head(s, t->pool, 1, g), scores,
        t->attn + ((size_t)r * hq + (size_t)g * group) * d, t->ahead);
}

static void attention_item(void *arg, int index) {
    AttnTask *t = (AttnTask *)arg;
    const AttnItem *it = t->items + index;
    if (it->head >= 0) {
        attention_single(t, it->row, it->head);
        return;
    }
    /* The KV head's query heads on this core: in one pass where attention_group is built
     * for their shape, else one after the other, the keys and values then coming from
     * memory for the first and from this core's caches for the others (an item a query
     * head had the cores read them from memory up to once each). */
    int group = t->s->heads / t->s->kv_heads;
    if (attention_group(t, it->row, it->g, group)) return;
    for (int h = 0; h < group; h++) attention_single(t, it->row, it->g * group + h);
}

/* The step's attention items: per row an item per KV head (an item per query head where
 * heads are not whole groups), the rows of one sequence (consecutive rows with the same
 * block table) KV head by KV head, so its keys and values stay in the caches from one row
 * to the next. Returns their count; items holds room for rows * heads. */
static int attention_items(const LayerShape *s, int rows, const int64_t *block_tables,
                           int table_width, AttnItem *items) {
    int hq = s->heads, hkv = s->kv_heads, n = 0;
    size_t row_bytes = sizeof(int64_t) * (size_t)table_width;
    for (int r0 = 0; r0 < rows;) {
        int r1 = r0 + 1;
        while (r1 < rows && !memcmp(block_tables + (size_t)r0 * table_width,
                                    block_tables + (size_t)r1 * table_width, row_bytes))
            r1++;
        if (hq % hkv == 0) {
            for (int g = 0; g < hkv; g++)
                for (int r = r0; r < r1; r++) items[n++] = (AttnItem){r, -1, g};
        } else {
            for (int r = r0; r < r1; r++)
                for (int head = 0; head < hq; head++) items[n++] = (AttnItem){r, head, 0};
        }
        r0 = r1;
    }
    return n;
}

/* The rows' attention as a step of this path runs it: qkv [rows, heads + 2 * kv_heads,
 * head_dim] (rope applied; the rows' K/V in the pool already) over the positions up to
 * each row's own -> out [rows, heads, head_dim]. Returns 0, or -1 where memory ran out. */
int decode_attention(const LayerShape *s, const float *qkv, int rows, const int64_t *positions,
                     const int64_t *block_tables, int table_width, const void *pool,
                     float *out, int nthreads) {
    AttnItem *items = malloc(sizeof(AttnItem) * (size_t)rows * s->heads);
    if (!items) return -1;
    int n_items = attention_items(s, rows, block_tables, table_width, items);
    AttnTask at = {s, qkv, out, positions, block_tables, table_width, pool, items,
                   rows >= PREFETCH_MIN_ROWS, 0};
    pool_run(attention_item, &at, n_items, nthreads);
    free(items);
    return at.failed ? -1 : 0;
}

/* The torch path's rows (decodes, guesses, chunks of a few rows) through the same passes:
 * row r belongs to the sequence whose block table is tables[row_seq[r]] (table_width ids
 * each) and sits at positions[r]; its K/V (qkv's) are written to the pool first, so a
 * chunk sees its own earlier rows. Everything is checked before anything is written: bad
 * input leaves the pool as it was. Returns 0, -1 (bad input) or -2 (out of memory). */
int paged_attention(const LayerShape *s, const float *qkv, int rows, const int64_t *positions,
                    const int32_t *row_seq, const int64_t *tables, int num_tables,
                    int table_width, void *pool, float *out, int nthreads) {
    const int d = s->head_dim, hq = s->heads, hkv = s->kv_heads, bs = s->block_size;
    if (rows <= 0) return 0;
    if (hkv <= 0 || hq % hkv || bs <= 0 || d <= 0 || table_width <= 0) return -1;
    for (int r = 0; r < rows; r++) {
        const int64_t pos = positions[r];
        const int seq = row_seq[r];
        if (pos < 0 || seq < 0 || seq >= num_tables || pos / bs >= table_width) return -1;
        const int64_t *table = tables + (size_t)seq * table_width;
        for (int64_t b = 0; b <= pos / bs; b++)
            if (table[b] < 0 || table[b] >= s->num_blocks) return -1;
    }
    /* Each row's own copy of its table: the passes take one a row, and rows of one
     * sequence (equal tables, next to each other) go KV head by KV head. */
    int64_t *row_tables = malloc(sizeof(int64_t) * (size_t)rows * table_width);
    if (!row_tables) return -2;
    const int nqkv = (hq + 2 * hkv) * d;
    const size_t head_stride = kv_head_elems(s), R = kv_row(d, s->kv_type);
    for (int r = 0; r < rows; r++) {
        const int64_t *table = tables + (size_t)row_seq[r] * table_width;
        memcpy(row_tables + (size_t)r * table_width, table, sizeof(int64_t) * table_width);
        const int64_t pos = positions[r];
        const size_t slot = (size_t)table[pos / bs] * bs + pos % bs;
        const float *kv = qkv + (size_t)r * nqkv + (size_t)hq * d;
        for (int g = 0; g < 2 * hkv; g++)
            kv_put(pool, g * head_stride + slot * R, kv + (size_t)g * d, d, s->kv_type);
    }
    const int rc = decode_attention(s, qkv, rows, positions, row_tables, table_width, pool, out,
                                    nthreads);
    free(row_tables);
    return rc ? -2 : 0;
}
