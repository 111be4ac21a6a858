/* Fused CPU kernels of the embedded model's forward (structgen.backends.embedded.native).
 *
 * Built at first use with the machine's C compiler (-O3 -march=native -fopenmp) and loaded
 * with ctypes after torch, so `#pragma omp parallel` runs on torch's own OpenMP pool (the
 * process has one libgomp: torch's): no second set of threads spinning against torch's.
 *
 * Each kernel exists for float32 (suffix _f32) and bfloat16 (_bf16, stored as uint16_t);
 * arithmetic is float32, results are rounded to the storage type once, as torch's
 * kernels round each op's result (round to nearest even).
 *
 * All tensors are contiguous unless a stride is passed; the Python side checks.
 */
#define _GNU_SOURCE  /* syscall() under -std=c11 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_D 256     /* head_dim */
#define MAX_G 16      /* query heads per KV head */

static inline float bf16_load(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t bf16_store(float f) {  /* round to nearest even; a NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* sg_exp's constants, shared with its 16-lane twin sg_exp512. */
#define SG_LOG2E 1.44269504088896341f
#define SG_LN2_HI 0.693359375f
#define SG_LN2_LO 2.12194440e-4f
#define SG_EXP_P0 1.9875691500e-4f
#define SG_EXP_P1 1.3981999507e-3f
#define SG_EXP_P2 8.3334519073e-3f
#define SG_EXP_P3 4.1665795894e-2f
#define SG_EXP_P4 1.6666665459e-1f
#define SG_EXP_P5 5.0000001201e-1f
#define SG_EXP_LO (-87.3f)
#define SG_EXP_HI 88.3f

/* e^x to about 2 ulp (Cephes expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n),
 * written so the compiler vectorises it (libm's expf stays scalar without -ffast-math).
 * x is clamped to [-87.3, 88.3] (e^x of a smaller x comes out ~1e-38, not 0); NaN stays NaN. */
static inline float sg_exp(float x) {
  x = x < SG_EXP_LO ? SG_EXP_LO : x;
  x = x > SG_EXP_HI ? SG_EXP_HI : x;
  float n = __builtin_floorf(x * SG_LOG2E + 0.5f);
  float r = x - n * SG_LN2_HI + n * SG_LN2_LO;
  float p = SG_EXP_P0;
  p = p * r + SG_EXP_P1;
  p = p * r + SG_EXP_P2;
  p = p * r + SG_EXP_P3;
  p = p * r + SG_EXP_P4;
  p = p * r + SG_EXP_P5;
  p = p * r * r + r + 1.f;
  int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, 4);
  return p * scale;
}

static inline float f32_load(float x) { return x; }
static inline float f32_store(float f) { return f; }

/* Subnormal floats flushed to zero (FTZ, DAZ) while a kernel runs on a thread, restored
 * after: a subnormal operand costs a microcode assist of ~100 cycles, and the vectorised
 * SiLU ran 8x slower on random inputs than on zeros without this. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define FLUSH_BEGIN unsigned _csr = _mm_getcsr(); _mm_setcsr(_csr | 0x8040u);
#define FLUSH_END _mm_setcsr(_csr);
#else
#define FLUSH_BEGIN
#define FLUSH_END
#endif

/* Prefetch (into L1) the K and V rows [row_bytes each] at slots ix[0..n-1]: the keys of the
 * next entry, read from memory while the current one computes (its slots are anywhere in
 * the pool, so the hardware prefetcher does not guess them). Measured on the decode kernel
 * over 30 layers' pools, 256 sequences of 40-61 keys: 1.16 ms a call without, 1.01 with. */
static inline void prefetch_rows(const void *kc, const void *vc, const int64_t *ix, int n,
                                 size_t row_bytes) {
  for (int l = 0; l < n; l++) {
    const char *kp = (const char *)kc + (size_t)ix[l] * row_bytes;
    const char *vp = (const char *)vc + (size_t)ix[l] * row_bytes;
    for (size_t o = 0; o < row_bytes; o += 64) {
      __builtin_prefetch(kp + o, 0, 3);
      __builtin_prefetch(vp + o, 0, 3);
    }
  }
}

/* Work item w of n split over the OpenMP team: [lo, hi). */
#define TEAM_RANGE(n, lo, hi)                                         \
  int _t = omp_get_thread_num(), _nt = omp_get_num_threads();        \
  long lo = (long)(n) * _t / _nt, hi = (long)(n) * (_t + 1) / _nt;


/* The attention of bfloat16 heads of head_dim 64 (SmolLM2's, Llama 3.2's...), where the CPU
 * has AVX-512 BF16: q.k by vdpbf16ps (bf16 pairs multiplied exactly, summed in float32) for
 * 16 keys at a time, their 16 partial sums reduced together; one pass over the keys with an
 * online softmax; up to 4 query heads of a KV head at a time, their accumulators in
 * registers. Elsewhere (float32, another head_dim, another CPU) the generic loop below runs.
 * Measured alone (256 sequences of 40-61 keys, 9 heads over 3, 2 cores, keys in cache):
 * 0.43 ms a call against 0.77 ms for the generic loop, of which q.k and the softmax 0.31. */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define SG_FEATURES 1

/* Lane i of the result: the sum of the lanes of v[i'] where i' = transpose4(i) (the order
 * the caller loads keys in: input s holds key ((s & 3) << 2) | (s >> 2)). */
static inline __m512 sg_hsum16(const __m512 *v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; i++)
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; i++)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; i++)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

/* sg_exp on 16 lanes (-inf gives 0: clamped to e^-87.3 ~ 1e-38, then flushed by the
 * caller's mask, see attend64). */
static inline __m512 sg_exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(SG_EXP_LO));
  x = _mm512_min_ps(x, _mm512_set1_ps(SG_EXP_HI));
  __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(SG_LOG2E),
                                                  _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(SG_LN2_LO),
                             _mm512_fnmadd_ps(n, _mm512_set1_ps(SG_LN2_HI), x));
  __m512 p = _mm512_set1_ps(SG_EXP_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SG_EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SG_EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SG_EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SG_EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SG_EXP_P5));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline __m512 sg_bf16_widen(__m256i h) {  /* 16 bf16 -> float32 */
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 sg_bf16x16(const uint16_t *p) {
  return sg_bf16_widen(_mm256_loadu_si256((const __m256i *)p));
}

static const uint16_t sg_zero_row[64] __attribute__((aligned(64)));

static inline __m512bh sg_ld_bh(const uint16_t *p) {
  __m512bh x;
  memcpy(&x, p, sizeof x);
  return x;
}

#define DEFINE_FAST64(GG)                                                                    \
static void attend64_g##GG(const uint16_t *q, const uint16_t *kc, const uint16_t *vc,        \
                           const int64_t *ix, int n, int j, int KV, float scale,             \
                           uint16_t *out, float *lse) {                                      \
  __m512 acc[GG][4];                                                                         \
  float m[GG], z[GG], corr[GG], pb[GG][16] __attribute__((aligned(64)));                    \
  for (int g = 0; g < GG; g++) {                                                             \
    m[g] = -INFINITY; z[g] = 0.f;                                                            \
    for (int c = 0; c < 4; c++) acc[g][c] = _mm512_setzero_ps();                              \
  }                                                                                          \
  const size_t stride = (size_t)KV * 64, off = (size_t)j * 64;                               \
  const __m512 vscale = _mm512_set1_ps(scale);                                               \
  for (int l0 = 0; l0 < n; l0 += 16) {                                                       \
    int nb = n - l0 < 16 ? n - l0 : 16;                                                      \
    const uint16_t *kr[16];                                                                  \
    for (int s = 0; s < 16; s++) {                                                           \
      int l = ((s & 3) << 2) | (s >> 2);                                                     \
      kr[s] = l < nb ? kc + (size_t)ix[l0 + l] * stride + off : sg_zero_row;                 \
    }                                                                                        \
    __mmask16 live = (__mmask16)((1u << nb) - 1u);                                           \
    for (int g = 0; g < GG; g++) {                                                           \
      const __m512bh qa = sg_ld_bh(q + g * 64), qb = sg_ld_bh(q + g * 64 + 32);              \
      __m512 t[16];                                                                          \
      for (int s = 0; s < 16; s++)                                                           \
        t[s] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), sg_ld_bh(kr[s]), qa),   \
                                sg_ld_bh(kr[s] + 32), qb);                                   \
      __m512 v = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY),                       \
                                      _mm512_mul_ps(sg_hsum16(t), vscale));                  \
      float bm = _mm512_reduce_max_ps(v), mn = bm > m[g] ? bm : m[g];                        \
      corr[g] = sg_exp(m[g] - mn);                                                           \
      __m512 pv = _mm512_maskz_mov_ps(live, sg_exp512(_mm512_sub_ps(v, _mm512_set1_ps(mn)))); \
      _mm512_store_ps(pb[g], pv);                                                            \
      z[g] = z[g] * corr[g] + _mm512_reduce_add_ps(pv); m[g] = mn;                           \
    }                                                                                        \
    _Pragma("GCC unroll 4")                                                                  \
    for (int g = 0; g < GG; g++) {                                                           \
      __m512 cv = _mm512_set1_ps(corr[g]);                                                   \
      for (int c = 0; c < 4; c++) acc[g][c] = _mm512_mul_ps(acc[g][c], cv);                  \
    }                                                                                        \
    for (int l = 0; l < nb; l++) {                                                           \
      const uint16_t *vr = vc + (size_t)ix[l0 + l] * stride + off;                           \
      __m512 v0 = sg_bf16x16(vr), v1 = sg_bf16x16(vr + 16), v2 = sg_bf16x16(vr + 32),        \
             v3 = sg_bf16x16(vr + 48);                                                       \
      _Pragma("GCC unroll 4")                                                                \
      for (int g = 0; g < GG; g++) {                                                         \
        __m512 p = _mm512_set1_ps(pb[g][l]);                                                 \
        acc[g][0] = _mm512_fmadd_ps(p, v0, acc[g][0]);                                       \
        acc[g][1] = _mm512_fmadd_ps(p, v1, acc[g][1]);                                       \
        acc[g][2] = _mm512_fmadd_ps(p, v2, acc[g][2]);                                       \
        acc[g][3] = _mm512_fmadd_ps(p, v3, acc[g][3]);                                       \
      }                                                                                      \
    }                                                                                        \
  }                                                                                          \
  for (int g = 0; g < GG; g++) {                                                             \
    float o[64];                                                                             \
    __m512 inv = _mm512_set1_ps(1.f / z[g]);                                                 \
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[g][c], inv)); \
    for (int d = 0; d < 64; d++) out[g * 64 + d] = bf16_store(o[d]);                         \
    lse[g] = m[g] + logf(z[g]);                                                              \
  }                                                                                          \
}
DEFINE_FAST64(1)
DEFINE_FAST64(2)
DEFINE_FAST64(3)
DEFINE_FAST64(4)

/* G query heads (any G) of KV head j, 4 at a time. */
static void attend64_bf16(const uint16_t *q, const uint16_t *kc, const uint16_t *vc,
                          const int64_t *ix, int n, int j, int KV, int G, float scale,
                          uint16_t *out, float *lse) {
  for (int g = 0; g < G; g += 4) {
    int k = G - g < 4 ? G - g : 4;
    const uint16_t *qq = q + (size_t)g * 64;
    uint16_t *oo = out + (size_t)g * 64;
    if (k == 4) attend64_g4(qq, kc, vc, ix, n, j, KV, scale, oo, lse + g);
    else if (k == 3) attend64_g3(qq, kc, vc, ix, n, j, KV, scale, oo, lse + g);
    else if (k == 2) attend64_g2(qq, kc, vc, ix, n, j, KV, scale, oo, lse + g);
    else attend64_g1(qq, kc, vc, ix, n, j, KV, scale, oo, lse + g);
  }
}

/* The attention of every decode query to a prefix its sequences share (the cascade's shared
 * part), bfloat16 heads of head_dim 64, on AMX tiles where the CPU has AMX-BF16. The queries
 * of KV head j (B rows x G heads) are taken 16 at a time: their scores against all P keys by
 * tile products (bf16 pairs, float32 sums) into a float buffer, a softmax over each row in
 * base 2 (one max pass, one pass of 2^x, its sum and the bf16 weights), then the weights
 * times V by tile products into four 16 x 16 float tiles. K and V are first packed per call
 * into the tiles' pair layout (VNNI), keys padded to 32 with zeros (their weights are 0).
 * Measured alone (256 rows, 9 heads over 3, 389 keys, 2 cores): 0.26 ms a call against
 * 0.54-0.85 ms for torch's fused CPU attention on the same tensors. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define SG_AMX 2
#define SG_LN2 0.693147180559945309f
#define SG_MAX_SHARED 16384  /* keys: the score buffer is 16 x P floats a thread */

/* Linux lends a thread the AMX tile state only after the process asks (ARCH_REQ_XCOMP_PERM
 * for XTILEDATA); 0 once granted (torch's oneDNN may have asked already: asking again is
 * harmless). */
int sg_amx_init(void) { return (int)syscall(SYS_arch_prctl, 0x1023, 18); }

/* 2^t on 16 lanes (t <= 0 here; about 3e-6 relative): t = n + f, |f| <= 1/2, a degree-5
 * polynomial in f, times 2^n by vscalefps (a t below -150 gives 0, -inf gives 0). */
static inline __m512 sg_exp2_512(__m512 t) {
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } sg_tilecfg;

/* Eight tiles of 16 rows x 64 bytes. In the score phase 0-1 hold scores, 2-3 and 6-7 keys,
 * 4-5 the queries' two halves of head_dim; in the value phase 0-3 the output, 4 the
 * weights, 5-7 values. The thread's configuration before (oneDNN's, torch's brgemm's: a
 * library may keep its tiles configured between calls and not configure them again) is
 * saved in *before and given back by sg_tiles_off. */
static void sg_tiles_on(sg_tilecfg *before) {
  _tile_storeconfig(before);  /* all zeros where no tiles were configured */
  sg_tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
}

static void sg_tiles_off(const sg_tilecfg *before) {
  if (before->palette) _tile_loadconfig(before);
  else _tile_release();
}

/* K and V of KV head j, keys [16 kb, 16 kb + 16) (V: with the next 16, for even kb), into
 * the pair layout: K as 2 tiles (dims 0-31, 32-63) of 16 rows (dim pairs) x 16 keys; V as
 * 4 tiles (16 dims each) of 16 rows (key pairs) x 16 dims. Keys past P are zeros. */
static void sg_pack_kv(const uint16_t *kc, const uint16_t *vc, size_t rs, int j, int kb, int P,
                       uint32_t *kp, uint32_t *vp) {
  for (int n = 0; n < 16; n++) {
    int key = kb * 16 + n;
    const uint32_t *src = key < P ? (const uint32_t *)(kc + (size_t)key * rs + (size_t)j * 64) : NULL;
    for (int r = 0; r < 32; r++) kp[(r >> 4) * 256 + (r & 15) * 16 + n] = src ? src[r] : 0u;
  }
  if (kb & 1) return;
  for (int r = 0; r < 16; r++) {
    int k0 = kb * 16 + 2 * r, k1 = k0 + 1;
    const uint16_t *a = k0 < P ? vc + (size_t)k0 * rs + (size_t)j * 64 : NULL;
    const uint16_t *b = k1 < P ? vc + (size_t)k1 * rs + (size_t)j * 64 : NULL;
    for (int d = 0; d < 64; d++)
      vp[(d >> 4) * 256 + r * 16 + (d & 15)] = (a ? a[d] : 0u) | ((uint32_t)(b ? b[d] : 0u) << 16);
  }
}

/* q [R, H, 64]; the prefix's keys and values k, v: P slots of rows KV * 64 (slot p at
 * k + p * KV * 64); rows: B rows of q to attend (NULL: rows 0..B-1, B <= R). Writes out
 * [R, H, 64] and lse [R, H] at those rows; with merge, out and lse there already hold
 * those queries' attention over other keys (their own), and the two are merged by their
 * log-sum-exp (as merge_partials, the shared part unrounded). */
int sg_shared_attn_bf16(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int64_t *rows,
                        int B, int R, int H, int KV, int P, float scale, int merge,
                        uint16_t *out, float *lse) {
  const int D = 64, G = H / KV;
  if (G * KV != H || P < 1 || P > SG_MAX_SHARED || B > R) return -1;
  if (B < 1) return 0;
  const int PP = (P + 31) & ~31;
  const long N = (long)B * G, QB = (N + 15) / 16;
  const size_t rs = (size_t)KV * D;
  uint16_t *kp = aligned_alloc(64, (size_t)KV * PP * D * 2), *vp = aligned_alloc(64, (size_t)KV * PP * D * 2);
  if (kp == NULL || vp == NULL) { free(kp); free(vp); return -2; }
  int err = 0;
  _Pragma("omp parallel")
  {
    FLUSH_BEGIN
    _Pragma("omp for schedule(static)")
    for (long w = 0; w < (long)KV * (PP / 16); w++) {
      int j = (int)(w / (PP / 16)), kb = (int)(w % (PP / 16));
      sg_pack_kv(kc, vc, rs, j, kb, P, (uint32_t *)kp + ((size_t)j * (PP / 16) + kb) * 512,
                 (uint32_t *)vp + ((size_t)j * (PP / 32) + kb / 2) * 1024);
    }  /* (a barrier) */
    float *s = aligned_alloc(64, sizeof(float) * 16 * PP);
    uint16_t *pb = aligned_alloc(64, sizeof(uint16_t) * 16 * PP);
    uint16_t qbuf[16 * 64] __attribute__((aligned(64)));
    float obuf[16 * 64] __attribute__((aligned(64))), m[16], z[16];
    size_t head[16];
    if (s == NULL || pb == NULL) { _Pragma("omp atomic write") err = -2; }
    sg_tilecfg before __attribute__((aligned(64)));
    sg_tiles_on(&before);
    const float c2 = scale * SG_LOG2E;
    const int full = P & ~15;
    const __mmask16 tail = (__mmask16)((1u << (P - full)) - 1u);
    _Pragma("omp for schedule(static)")
    for (long w = 0; w < (long)KV * QB; w++) {
      if (s == NULL || pb == NULL) continue;
      const int j = (int)(w / QB);
      const long r0 = (w % QB) * 16;
      const int nr = N - r0 < 16 ? (int)(N - r0) : 16;
      int bad = 0;
      for (int i = 0; i < 16; i++) {
        if (i >= nr) { memset(qbuf + i * 64, 0, 128); continue; }
        long b = (r0 + i) / G, g = (r0 + i) % G, row = rows == NULL ? b : rows[b];
        if (row < 0 || row >= R) { bad = 1; break; }
        head[i] = (size_t)row * H + (size_t)j * G + (size_t)g;
        memcpy(qbuf + i * 64, q + head[i] * D, 128);
      }
      if (bad) { _Pragma("omp atomic write") err = -3; continue; }
      _tile_loadd(4, qbuf, 128);
      _tile_loadd(5, qbuf + 32, 128);
      const uint16_t *kj = kp + (size_t)j * PP * D, *vj = vp + (size_t)j * PP * D;
      for (int kb = 0; kb < PP / 16; kb += 2) {  /* 32 keys' scores: tiles 0 and 1 */
        const uint16_t *kk = kj + (size_t)kb * 1024;
        _tile_loadd(2, kk, 64);
        _tile_loadd(3, kk + 512, 64);
        _tile_loadd(6, kk + 1024, 64);
        _tile_loadd(7, kk + 1536, 64);
        _tile_zero(0);
        _tile_zero(1);
        _tile_dpbf16ps(0, 4, 2);
        _tile_dpbf16ps(1, 4, 6);
        _tile_dpbf16ps(0, 5, 3);
        _tile_dpbf16ps(1, 5, 7);
        _tile_stored(0, s + kb * 16, PP * 4);
        _tile_stored(1, s + kb * 16 + 16, PP * 4);
      }
      /* each row's weights 2^(c2 s - c2 max) over its first P keys, 0 past them */
      const __m512 vc2 = _mm512_set1_ps(c2);
      for (int i = 0; i < 16; i++) {
        const float *si = s + (size_t)i * PP;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int l = 0; l < full; l += 16) mx = _mm512_max_ps(mx, _mm512_load_ps(si + l));
        if (tail) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_load_ps(si + full));
        const float mm = _mm512_reduce_max_ps(mx) * c2;
        const __m512 vm = _mm512_set1_ps(mm);
        __m512 acc = _mm512_setzero_ps();
        uint16_t *pi = pb + (size_t)i * PP;
        for (int l = 0; l < PP; l += 16) {
          __m512 e = sg_exp2_512(_mm512_fmsub_ps(_mm512_load_ps(si + l), vc2, vm));
          if (l >= full) e = _mm512_maskz_mov_ps(l == full ? tail : 0, e);
          acc = _mm512_add_ps(acc, e);
          _mm256_store_si256((__m256i *)(pi + l), (__m256i)_mm512_cvtneps_pbh(e));
        }
        m[i] = mm * SG_LN2;
        z[i] = _mm512_reduce_add_ps(acc);
      }
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int kb = 0; kb < PP / 32; kb++) {  /* weights [16 x 32 keys] times V */
        const uint16_t *vb = vj + (size_t)kb * 2048;
        _tile_loadd(4, pb + kb * 32, PP * 2);
        _tile_loadd(5, vb, 64);
        _tile_loadd(6, vb + 512, 64);
        _tile_loadd(7, vb + 1024, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, vb + 1536, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, obuf, 256);
      _tile_stored(1, obuf + 16, 256);
      _tile_stored(2, obuf + 32, 256);
      _tile_stored(3, obuf + 48, 256);
      for (int i = 0; i < nr; i++) {
        float l1 = m[i] + logf(z[i]), w1 = 1.f / z[i];
        uint16_t *o = out + head[i] * D;
        if (merge) {  /* o = o2 + sigmoid(l1 - l2) (o1 - o2) */
          float l2 = lse[head[i]], hi = l1 > l2 ? l1 : l2;
          float a = 1.f / (1.f + expf(l2 - l1));
          for (int d = 0; d < D; d++) {
            float o2 = bf16_load(o[d]);
            o[d] = bf16_store(o2 + a * (obuf[i * 64 + d] * w1 - o2));
          }
          lse[head[i]] = hi + logf(expf(l1 - hi) + expf(l2 - hi));
        } else {
          for (int d = 0; d < D; d++) o[d] = bf16_store(obuf[i * 64 + d] * w1);
          lse[head[i]] = l1;
        }
      }
    }
    sg_tiles_off(&before);
    free(s);
    free(pb);
    FLUSH_END
  }
  free(kp);
  free(vp);
  return err;
}
#else
#define SG_AMX 0
#endif
#define FAST64_bf16(...) (D == 64 ? (attend64_bf16(__VA_ARGS__), 1) : 0)

/* The elementwise kernels of bfloat16 rows in AVX-512 (the generic loops below compiled to
 * ~3 cycles an element: the scalar rounding did not vectorise well). Rounding is
 * vcvtneps2bf16's: to nearest even, as bf16_store (subnormals flushed, as the kernels run
 * with FTZ/DAZ anyway). Tails of a row by masks. */
static inline __m512 sg_bf16_ld(const uint16_t *p, __mmask16 k) {
  return sg_bf16_widen(_mm256_maskz_loadu_epi16(k, p));
}
static inline __m256i sg_bf16_round(__m512 f) { return (__m256i)_mm512_cvtneps_pbh(f); }
static inline void sg_bf16_st(uint16_t *p, __mmask16 k, __m512 f) {
  _mm256_mask_storeu_epi16(p, k, sg_bf16_round(f));
}
static inline __mmask16 sg_lanes(int left) { return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u); }

static void silu_mul_row_avx512(const uint16_t *g, const uint16_t *u, uint16_t *o, int I) {
  for (int i = 0; i < I; i += 16) {
    __mmask16 k = sg_lanes(I - i);
    __m512 a = sg_bf16_ld(g + i, k);
    __m512 d = _mm512_add_ps(_mm512_set1_ps(1.f), sg_exp512(_mm512_sub_ps(_mm512_setzero_ps(), a)));
    /* a / d as torch divides (a reciprocal to 14 bits and a Newton step moved halfway
     * cases of the bf16 rounding) */
    __m512 silu = sg_bf16_widen(sg_bf16_round(_mm512_div_ps(a, d)));
    sg_bf16_st(o + i, k, _mm512_mul_ps(silu, sg_bf16_ld(u + i, k)));
  }
}
#define FAST_SILU_bf16(g, u, o, I) (silu_mul_row_avx512(g, u, o, I), 1)

static void rms_norm_row_avx512(uint16_t *x, const uint16_t *res, const uint16_t *w, uint16_t *y,
                                int N, float eps) {
  __m512 ss = _mm512_setzero_ps();
  for (int i = 0; i < N; i += 16) {
    __mmask16 k = sg_lanes(N - i);
    __m512 v = sg_bf16_ld(x + i, k);
    if (res != NULL) {
      __m256i h = sg_bf16_round(_mm512_add_ps(v, sg_bf16_ld(res + i, k)));
      _mm256_mask_storeu_epi16(x + i, k, h);
      v = sg_bf16_widen(h);
    }
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  __m512 inv = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(ss) / (float)N + eps));
  for (int i = 0; i < N; i += 16) {
    __mmask16 k = sg_lanes(N - i);
    __m512 n = sg_bf16_widen(sg_bf16_round(_mm512_mul_ps(sg_bf16_ld(x + i, k), inv)));
    sg_bf16_st(y + i, k, _mm512_mul_ps(sg_bf16_ld(w + i, k), n));
  }
}
#define FAST_RMS_bf16(x, res, w, y, N, eps) (rms_norm_row_avx512(x, res, w, y, N, eps), 1)
#else
#define FAST64_bf16(...) 0
#define FAST_SILU_bf16(...) 0
#define FAST_RMS_bf16(...) 0
#define SG_FEATURES 0
#endif
#define FAST64_f32(...) 0
#define FAST_SILU_f32(...) 0
#define FAST_RMS_f32(...) 0
#ifndef SG_AMX
#define SG_AMX 0
#endif
#if !SG_AMX
int sg_amx_init(void) { return -1; }
int sg_shared_attn_bf16(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int64_t *rows,
                        int B, int R, int H, int KV, int P, float scale, int merge,
                        uint16_t *out, float *lse) {
  (void)q; (void)kc; (void)vc; (void)rows; (void)B; (void)R; (void)H; (void)KV; (void)P;
  (void)scale; (void)merge; (void)out; (void)lse;
  return -4;  /* not built: no AMX-BF16 here */
}
#endif

#define DEFINE_KERNELS(SUF, T, LOAD, STORE)                                                      \
/* One KV head's attention for G query heads q (rows of length D, G consecutive heads)    \
 * against n keys read in place at slots ix[0..n-1] of a KV layer [slots, KV, D], head j:  \
 * out (G rows of D) and lse (G floats). s: scratch of G * n floats. */                     \
static void attend_group_##SUF(const T *q, const T *kc, const T *vc, const int64_t *ix,    \
                               int n, int j, int KV, int G, int D, float scale, float *s,   \
                               T *out, float *lse) {                                        \
  float qf[MAX_G][MAX_D], acc[MAX_G][MAX_D], row[MAX_D];                                    \
  for (int g = 0; g < G; g++)                                                               \
    for (int d = 0; d < D; d++) qf[g][d] = LOAD(q[(size_t)g * D + d]) * scale;              \
  for (int l = 0; l < n; l++) {                                                             \
    const T *kk = kc + ((size_t)ix[l] * KV + j) * D;                                        \
    for (int d = 0; d < D; d++) row[d] = LOAD(kk[d]);                                       \
    for (int g = 0; g < G; g++) {                                                           \
      float t = 0.f;                                                                        \
      for (int d = 0; d < D; d++) t += qf[g][d] * row[d];                                   \
      s[g * n + l] = t;                                                                     \
    }                                                                                       \
  }                                                                                         \
  for (int g = 0; g < G; g++) {                                                             \
    float *sg = s + g * n, m = -INFINITY, z = 0.f;                                          \
    for (int l = 0; l < n; l++) m = sg[l] > m ? sg[l] : m;                                  \
    for (int l = 0; l < n; l++) { sg[l] = sg_exp(sg[l] - m); z += sg[l]; }                 \
    float inv = 1.f / z;                                                                    \
    for (int l = 0; l < n; l++) sg[l] *= inv;                                               \
    lse[g] = m + logf(z);                                                                   \
    for (int d = 0; d < D; d++) acc[g][d] = 0.f;                                            \
  }                                                                                         \
  for (int l = 0; l < n; l++) {                                                             \
    const T *vv = vc + ((size_t)ix[l] * KV + j) * D;                                        \
    for (int d = 0; d < D; d++) row[d] = LOAD(vv[d]);                                       \
    for (int g = 0; g < G; g++) {                                                           \
      float p = s[g * n + l];                                                               \
      for (int d = 0; d < D; d++) acc[g][d] += p * row[d];                                  \
    }                                                                                       \
  }                                                                                         \
  for (int g = 0; g < G; g++)                                                               \
    for (int d = 0; d < D; d++) out[(size_t)g * D + d] = STORE(acc[g][d]);                  \
}                                                                                           \
                                                                                            \
/* Entries reading their own keys (slots index[e, ..], [E, L]) from a KV layer in place.  \
 * pos == NULL: entry e is one query at row e reading its first keys[e] keys (1..L).        \
 * Else entry e has nq[e] queries (1..N) at rows pos[e, 0..nq[e]-1] ([E, N]); its i-th      \
 * reads its first keys[e] + i + 1 keys (causal; keys[e] >= 0, keys[e] + nq[e] <= L).       \
 * Writes out [R, H, D] and lse [R, H] at those rows only. */                               \
static int attend_entries_##SUF(const T *q, const T *kc, const T *vc, const int64_t *index, \
                                const int64_t *pos, const int32_t *nq, const int32_t *keys, \
                                int E, int N, int R, int H, int KV, int D, int L,           \
                                float scale, T *out, float *lse) {                          \
  int G = H / KV;                                                                           \
  if (D > MAX_D || G > MAX_G || G * KV != H) return -1;                                      \
  int err = 0;                                                                              \
  _Pragma("omp parallel")                                                                   \
  {                                                                                         \
    TEAM_RANGE((long)E * KV, lo, hi)                                                        \
    FLUSH_BEGIN                                                                             \
    float *s = malloc(sizeof(float) * (size_t)G * (L > 0 ? L : 1));                         \
    if (s == NULL) { _Pragma("omp atomic write") err = -2; lo = hi; }                        \
    for (long w = lo; w < hi; w++) {                                                        \
      int e = (int)(w / KV), j = (int)(w % KV);                                             \
      int runs = pos == NULL ? 1 : nq[e], first = pos == NULL ? keys[e] : keys[e] + 1;      \
      if (runs < 1 || (pos != NULL && runs > N) || first < 1 || first + runs - 1 > L) {     \
        _Pragma("omp atomic write") err = -3; continue; }                                   \
      if (j == 0 && e + 1 < E) {  /* the next entry's keys, while this one computes */       \
        int nn = pos == NULL ? keys[e + 1] : keys[e + 1] + nq[e + 1];                        \
        prefetch_rows(kc, vc, index + (size_t)(e + 1) * L, nn < L ? nn : L,                  \
                      (size_t)KV * D * sizeof(T));                                          \
      }                                                                                     \
      for (int i = 0; i < runs; i++) {                                                      \
        int64_t r = pos == NULL ? e : pos[(size_t)e * N + i];                               \
        if (r < 0 || r >= R) { _Pragma("omp atomic write") err = -3; break; }              \
        size_t head = (size_t)r * H + (size_t)j * G;                                        \
        if (!FAST64_##SUF(q + head * D, kc, vc, index + (size_t)e * L, first + i, j, KV, G, \
                          scale, out + head * D, lse + head))                              \
          attend_group_##SUF(q + head * D, kc, vc, index + (size_t)e * L, first + i, j, KV, \
                             G, D, scale, s, out + head * D, lse + head);                   \
      }                                                                                     \
    }                                                                                       \
    free(s);                                                                                \
    FLUSH_END                                                                               \
  }                                                                                         \
  return err;                                                                               \
}                                                                                           \
                                                                                            \
/* Decode attention of one-token queries against their own keys, read in place from a KV   \
 * layer [slots, KV, D] through a slot index: q [B, H, D], index [B, L] (row b's first      \
 * lens[b] entries are its slots), out [B, H, D], lse [B, H] (natural log-sum-exp of the    \
 * scaled scores, float32). Query head h reads KV head h / (H / KV). lens[b] >= 1. */        \
int sg_decode_attn_##SUF(const T *q, const T *kc, const T *vc, const int64_t *index,       \
                         const int32_t *lens, int B, int H, int KV, int D, int L, float scale, \
                         T *out, float *lse) {                                               \
  return attend_entries_##SUF(q, kc, vc, index, NULL, NULL, lens, B, 1, B, H, KV, D, L,     \
                              scale, out, lse);                                             \
}                                                                                           \
                                                                                            \
/* Causal attention of short runs of new tokens against their own keys, read in place:    \
 * entry e has nq[e] query rows, at rows pos[e, 0..nq[e]-1] of q [R, H, D], whose query i   \
 * reads its first ctx[e] + i + 1 keys (slots index[e, ..], [E, L]); out [R, H, D] and      \
 * lse [R, H] are written at those rows only. pos: [E, N]. */                               \
int sg_chunk_attn_##SUF(const T *q, const T *kc, const T *vc, const int64_t *index,        \
                        const int64_t *pos, const int32_t *nq, const int32_t *ctx, int E,   \
                        int N, int R, int H, int KV, int D, int L, float scale, T *out,     \
                        float *lse) {                                                       \
  return attend_entries_##SUF(q, kc, vc, index, pos, nq, ctx, E, N, R, H, KV, D, L, scale,  \
                              out, lse);                                                    \
}                                                                                           \
                                                                                            \
/* RMSNorm, as the model's torch code: xf = float(x); y = w * T(xf * rsqrt(mean(xf^2) +     \
 * eps)). With res != NULL, first x = T(x + res) (the residual add), written back to x.     \
 * x, res, y: [rows, N]; w: [N]. */                                                         \
void sg_rms_norm_##SUF(T *x, const T *res, const T *w, T *y, long rows, int N, float eps) { \
  _Pragma("omp parallel")                                                                   \
  {                                                                                         \
    TEAM_RANGE(rows, lo, hi)                                                                \
    FLUSH_BEGIN                                                                             \
    for (long r = lo; r < hi; r++) {                                                        \
      T *xr = x + r * N;                                                                    \
      if (FAST_RMS_##SUF(xr, res == NULL ? NULL : res + r * N, w, y + r * N, N, eps))       \
        continue;                                                                           \
      if (res != NULL) {                                                                    \
        const T *rr = res + r * N;                                                          \
        for (int i = 0; i < N; i++) xr[i] = STORE(LOAD(xr[i]) + LOAD(rr[i]));               \
      }                                                                                     \
      float ss = 0.f;                                                                       \
      for (int i = 0; i < N; i++) { float v = LOAD(xr[i]); ss += v * v; }                  \
      float inv = 1.f / sqrtf(ss / (float)N + eps);                                         \
      T *yr = y + r * N;                                                                    \
      for (int i = 0; i < N; i++)                                                           \
        yr[i] = STORE(LOAD(w[i]) * LOAD(STORE(LOAD(xr[i]) * inv)));                         \
    }                                                                                       \
    FLUSH_END                                                                               \
  }                                                                                         \
}                                                                                           \
                                                                                            \
/* out [rows, I] = T(T(silu(gate)) * up) for gu [rows, 2I] = [gate | up]. */                \
static void silu_mul_row_##SUF(const T *restrict g, const T *restrict u, T *restrict o, int I) { \
  if (FAST_SILU_##SUF(g, u, o, I)) return;                                                  \
  for (int i = 0; i < I; i++) {                                                             \
    float a = LOAD(g[i]), silu = a * (1.f / (1.f + sg_exp(-a)));  /* a / (...) ran 8x slower */ \
    o[i] = STORE(LOAD(STORE(silu)) * LOAD(u[i]));                                           \
  }                                                                                         \
}                                                                                           \
void sg_silu_mul_##SUF(const T *gu, T *out, long rows, int I) {                             \
  _Pragma("omp parallel")                                                                   \
  {                                                                                         \
    TEAM_RANGE(rows, lo, hi)                                                                \
    FLUSH_BEGIN                                                                             \
    for (long r = lo; r < hi; r++)                                                          \
      silu_mul_row_##SUF(gu + r * 2 * I, gu + r * 2 * I + I, out + r * I, I);               \
    FLUSH_END                                                                               \
  }                                                                                         \
}                                                                                           \
                                                                                            \
/* Rotary embedding in place on the first `heads` heads of each row of x (row stride        \
 * `stride` elements, head_dim D): x = x * cos + rotate_half(x) * sin_signed, where         \
 * rotate_half(x) = cat(x2, x1) and the sign is folded into sin_signed; cos/sin: [rows, D]. \
 * Rounded once (torch rounds x * cos first: results may differ in the last bit). */        \
void sg_rope_##SUF(T *x, long stride, const T *cos, const T *sin, long rows, int heads, int D) { \
  int half = D / 2;                                                                         \
  _Pragma("omp parallel")                                                                   \
  {                                                                                         \
    TEAM_RANGE(rows, lo, hi)                                                                \
    FLUSH_BEGIN                                                                             \
    float c[MAX_D], sn[MAX_D], a[MAX_D];                                                    \
    for (long r = lo; r < hi; r++) {                                                        \
      for (int d = 0; d < D; d++) { c[d] = LOAD(cos[r * D + d]); sn[d] = LOAD(sin[r * D + d]); } \
      for (int h = 0; h < heads; h++) {                                                     \
        T *xh = x + r * stride + (long)h * D;                                               \
        for (int d = 0; d < D; d++) a[d] = LOAD(xh[d]);                                     \
        for (int d = 0; d < half; d++) {                                                    \
          xh[d] = STORE(LOAD(STORE(a[d] * c[d])) + a[d + half] * sn[d]);                    \
          xh[d + half] = STORE(LOAD(STORE(a[d + half] * c[d + half])) + a[d] * sn[d + half]); \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    FLUSH_END                                                                               \
  }                                                                                         \
}

DEFINE_KERNELS(bf16, uint16_t, bf16_load, bf16_store)
DEFINE_KERNELS(f32, float, f32_load, f32_store)

/* The new tokens' K and V into one layer of the pool, rows of row_bytes each: source row i
 * (at ks + i * k_stride bytes, likewise v: a view of the fused projection) to slot slots[i]
 * of kc / vc (num_slots rows of row_bytes). -3 where a slot is outside the pool (nothing is
 * written then). torch's index_copy_ of the strided views took 14 us a layer for 300 rows. */
int sg_kv_write(char *kc, char *vc, const char *ks, const char *vs, const int64_t *slots, long n,
                long k_stride, long v_stride, long row_bytes, long num_slots) {
  for (long i = 0; i < n; i++)
    if (slots[i] < 0 || slots[i] >= num_slots) return -3;
  for (long i = 0; i < n; i++) {
    memcpy(kc + slots[i] * row_bytes, ks + i * k_stride, (size_t)row_bytes);
    memcpy(vc + slots[i] * row_bytes, vs + i * v_stride, (size_t)row_bytes);
  }
  return 0;
}

int sg_abi_version(void) { return 5; }

/* Bit 0: the AVX-512 BF16 attention of head_dim 64 was compiled in; bit 1: the AMX-BF16
 * attention to a shared prefix (sg_shared_attn_bf16). */
int sg_features(void) { return SG_FEATURES | SG_AMX; }
