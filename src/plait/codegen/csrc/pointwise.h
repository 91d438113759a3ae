// A 1x1 convolution (stride 1, no padding, one group) of a channels_last float32 map, with its
// bias, a residual add and an activation folded in (plait.codegen.pointwise_native puts it in a
// translation unit after the prelude, with one extern "C" entry per instantiation).
//
// On channels_last maps the convolution is a matrix product: x [P][C] (P = N*H*W pixels), the
// weight w [C][OP] (OP: the output channels O rounded up to 16, the padding zero), y [P][O];
// b [O] or null; r [P][O] (the residual) or null. A weight packed at compile time is blocked:
// the columns of each block of 64 output channels (the last one OP's rest) stored whole, one
// block after another, so that a block's rows are read as one stream (a [C][OP] weight's rows,
// read 256 bytes a row at a stride of OP floats, came from memory at half the speed). Each output is its bias plus its C
// products summed in channel order with fused multiply-adds (the contract's conv budget), then
// plus its residual, then activated.
//
// Work: tiles of up to 96 pixels (OpenMP-parallel over tiles for large calls), each by blocks of
// up to 64 output channels, each by blocks of KC input channels; inside, MR pixels by NB vectors
// of 16 channels held in registers (MR*NB <= 24), each input element broadcast from its row (no
// packing: the rows are read where they are).
//
// Activations (NaN kept, as PyTorch's), on each output after the residual: 0 none, 1 clamp
// ``v < lo ? lo : v`` then ``v > hi ? hi : v`` (an absent bound is an infinity), 2 silu
// ``v / (1 + exp(-v))`` (exp16 below, in registers before the store), 3 hardswish
// ``v * min(max(v + 3, 0), 6) / 6`` (hardswish16 below).
#include <immintrin.h>

namespace pw {
typedef int64_t i64;

struct Args {
  const float* x;
  const float* w;
  const float* b;
  const float* r;
  float* y;
  i64 p, c, o, op;
  bool blocked;  // w blocked (above), else [C][OP] row-major
  float lo, hi;
};

// exp of 16 lanes: n = round(x / ln 2), r = x - n ln 2 (in two parts), exp(r) by Cephes'
// degree-7 polynomial (about 1 ulp), times 2^n by scalef (overflow to inf, gradual underflow);
// x above expf's overflow bound is +inf, below its underflow bound 0, NaN stays NaN.
inline __m512 exp16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512 y = _mm512_scalef_ps(p, n);
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.7228394f), _CMP_GT_OQ), y,
                           _mm512_set1_ps(__builtin_inff()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.972084f), _CMP_LT_OQ),
                              y, _mm512_setzero_ps());
}

// silu of 16 lanes: v / (1 + exp(-v)) (a NaN v stays NaN; -inf gives NaN, as -inf / inf)
inline __m512 silu16(__m512 v, __m512 one) {
  return _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
}

// hardswish of 16 lanes as ATen's vector loop computes it: (v * min(max(v + 3, 0), 6)) / 6,
// the bounds compared as the clamp's (a NaN v stays NaN)
inline __m512 hardswish16(__m512 v) {
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
  __m512 t = _mm512_add_ps(v, _mm512_set1_ps(3.0f));
  t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, zero, _CMP_LT_OQ), t, zero);
  t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, six, _CMP_GT_OQ), t, six);
  return _mm512_div_ps(_mm512_mul_ps(v, t), six);
}

// One call's operands as locals (the intrinsics' stores may alias anything, so fields read
// through the Args would be loaded again after each store).
struct Tile {
  const float* x;  // the tile's first row
  const float* w;  // the weight panel's first element: row k0, column j0
  const float* b;  // the bias at column j0, or null
  const float* r;  // the residual at the tile's first row, column j0, or null
  float* y;        // the result at the tile's first row, column j0
  i64 c, o, op, k0, k1;  // op: the weight panel's row stride
  __mmask16 tail;  // the valid lanes of the block's last vector
  bool first, final;
  float lo, hi;
};

// MR pixels by NB vectors of output channels: their sums over channels [k0, k1), started
// from the bias (``first``) or the partial sums stored before, then stored partial, or
// (``final``) finished: plus the residual, activated, stored.
template <int MR, int NB, int ACT, bool RES>
inline void micro(const Tile& t, i64 m0) {
  const i64 c = t.c, o = t.o, op = t.op, k0 = t.k0, k1 = t.k1;
  float* const y = t.y + m0 * o;
  const __mmask16 tail = t.tail;
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
    const __m512 bv = t.b ? _mm512_maskz_loadu_ps(mk, t.b + j * 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      acc[m][j] = t.first ? bv : _mm512_maskz_loadu_ps(mk, y + m * o + j * 16);
    }
  }
  const float* rows[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) rows[m] = t.x + (m0 + m) * c;
  const float* wp = t.w;
  for (i64 k = k0; k < k1; ++k) {
    __m512 wv[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_ps(wp + j * 16);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(rows[m][k]);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
    }
    wp += op;
  }
  const __m512 one = _mm512_set1_ps(1.0f), lo = _mm512_set1_ps(t.lo), hi = _mm512_set1_ps(t.hi);
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
      __m512 v = acc[m][j];
      if (t.final) {
        if (RES) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, t.r + (m0 + m) * o + j * 16));
        if (ACT == 1) {
          v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), v, lo);
          v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), v, hi);
        }
        if (ACT == 2) v = silu16(v, one);
        if (ACT == 3) v = hardswish16(v);
      }
      _mm512_mask_storeu_ps(y + m * o + j * 16, mk, v);
    }
  }
}

template <int MR, int NB, int ACT, bool RES>
inline void rows(const Tile& t, i64 n) {
  i64 m = 0;
  for (; m + MR <= n; m += MR) micro<MR, NB, ACT, RES>(t, m);
  for (; m < n; ++m) micro<1, NB, ACT, RES>(t, m);
}

// NOTE: register blocks by vectors per block: 8x1, 8x2, 8x3, 6x4 (at most 24 accumulators,
// at most 8 row pointers: no spills)
template <int ACT, bool RES>
inline void block(const Tile& t, i64 n, int vecs) {
  if (vecs == 4) rows<6, 4, ACT, RES>(t, n);
  else if (vecs == 3) rows<8, 3, ACT, RES>(t, n);
  else if (vecs == 2) rows<8, 2, ACT, RES>(t, n);
  else rows<8, 1, ACT, RES>(t, n);
}

// NOTE: channels in blocks of KC: a block's weight panel (KC x 64 floats, 32 KB) stays in the
// L1 cache while the tile's rows run through it; the partial sums wait in the result, so every
// output's sum still runs in channel order.
constexpr i64 KC = 128;

extern "C" int omp_get_max_threads(void);

// NOTE: tiles of at most 96 pixels, as many per thread (where a call has 8192 products or
// more per thread: small calls split too, so that each thread reads the pixels it wrote in the
// call before, as depthwise.h's rows); a tile runs every channel block
template <int ACT, bool RES>
void conv(const Args& a) {
  const i64 most = omp_get_max_threads();
  const i64 threads = a.p * a.c * a.o >= most << 13 ? most : 1;
  i64 tiles = (a.p + 95) / 96;
  // NOTE: a multiple of the threads, so that each gets as many (a 14x14 map's 196 pixels: four
  // tiles of 49, not three of 66, two of them on one thread)
  tiles = (tiles + threads - 1) / threads * threads;
  if (tiles > a.p) tiles = a.p;
  const i64 rt = (a.p + tiles - 1) / tiles;
  // NOTE: work items are (tile, block of 64 output channels), tile-major: a thread takes whole
  // tiles where there are as many as threads, and a map of fewer pixels than threads (a
  // squeeze-and-excitation block's 1x1 map, bound by the weight's reads) splits its output
  // channels, each thread reading its own columns of the weight
  const i64 blocks = (a.o + 63) / 64;
#pragma omp parallel for schedule(static) if (threads > 1)
  for (i64 item = 0; item < tiles * blocks; ++item) {
    const i64 t = item / blocks, j0 = item % blocks * 64;
    const i64 r0 = t * rt, r1 = (t + 1) * rt < a.p ? (t + 1) * rt : a.p;
    if (r1 <= r0) continue;
    const i64 n = a.o - j0 < 64 ? a.o - j0 : 64;
    const int vecs = (int)((n + 15) / 16), last = (int)(n - (vecs - 1) * 16);
    for (i64 k0 = 0; k0 < a.c; k0 += KC) {
      Tile tile;
      tile.x = a.x + r0 * a.c;
      // NOTE: the panel's row stride: the block's width where blocked, else OP
      const i64 ws = !a.blocked ? a.op : a.op - j0 < 64 ? a.op - j0 : 64;
      tile.w = a.blocked ? a.w + j0 * a.c + k0 * ws : a.w + k0 * a.op + j0;
      tile.b = a.b ? a.b + j0 : nullptr;
      tile.r = RES ? a.r + r0 * a.o + j0 : nullptr;
      tile.y = a.y + r0 * a.o + j0;
      tile.c = a.c, tile.o = a.o, tile.op = ws;
      tile.k0 = k0, tile.k1 = k0 + KC < a.c ? k0 + KC : a.c;
      tile.tail = (__mmask16)((1u << last) - 1);
      tile.first = k0 == 0, tile.final = tile.k1 == a.c;
      tile.lo = a.lo, tile.hi = a.hi;
      block<ACT, RES>(tile, r1 - r0, vecs);
    }
  }
}

template <int ACT, bool RES>
int entry(const int64_t* p, const float* f) {
  Args a{(const float*)p[0], (const float*)p[1], (const float*)p[2], (const float*)p[3],
         (float*)p[4], p[5], p[6], p[7], p[8], p[9] != 0, f[0], f[1]};
  conv<ACT, RES>(a);
  return 0;
}
}  // namespace pw
