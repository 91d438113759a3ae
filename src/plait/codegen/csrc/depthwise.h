// A depthwise convolution (groups == channels, one filter per channel) of a channels_last float32
// map, with its zero padding, bias and activations folded in (plait.codegen.depthwise_conv puts
// it in a translation unit after the prelude, with one extern "C" entry per instantiation).
//
// Layouts: x [N][H][W][C], y [N][OH][OW][C], w [K][K][C] (taps outermost, channels innermost, so
// one tap of 16 channels is one vector load), b [C] or null. Each output is its bias plus the
// products of its in-bounds taps (a padded position is zero: its product is skipped, which is
// eager's sum wherever the weight is finite; the caller runs eager's convolution otherwise).
//
// Work: one output row at a time (OpenMP-parallel over rows of all but tiny calls), 16 channels per
// vector (a map of at most 128 channels: every vector of a block of pixels before the next
// block); interior columns in blocks of P output pixels whose input columns ((P-1)*S+K per tap
// row) are loaded once per tap row, activated once, and reused across the K taps of the row. The
// channels past the last multiple of 16 are one vector of masked lanes where the CPU has AVX-512
// (a map of 72 channels ran a ninth of them one at a time: a third of the call), else one
// channel at a time; either sums each output's taps in the same order.
//
// Pooled means (``pool`` not null, ``rows`` its scratch [N*OH][C]): each output row's sums per
// channel (its columns in order) are written once the row is stored, then after every row each
// image's rows are summed in order and divided by OH*OW into pool [N][C] (a global average
// pool of the result read where it was just written, the same for any number of threads).
//
// Activations (NaN kept, as PyTorch's): IA on each input element as it is loaded, OA on each
// output: 0 none, 1 clamp ``v < lo ? lo : v`` then ``v > hi ? hi : v`` (an absent bound is an
// infinity: its comparison is never true), 2 silu ``v / (1 + exp(-v))``, 3 hardswish
// ``v * min(max(v + 3, 0), 6) / 6`` as ATen's vector loop, multiplied, then divided (2 and 3:
// outputs only).
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
namespace dw {
extern "C" int omp_get_max_threads(void);
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int64_t i64;

inline v16 load(const float* p) { return *(const v16u*)p; }
inline void store(float* p, v16 v) { *(v16u*)p = v; }

// NOTE: M: only the lanes of ``m`` are read (the others are zero) and written, so that a
// vector of the channels' tail reads and writes nothing past them (AVX-512 only)
typedef unsigned short mask16;
template <bool M> inline v16 load(const float* p, mask16 m) {
  (void)m;
#if defined(__AVX512F__)
  if (M) return (v16)_mm512_maskz_loadu_ps(m, p);
#endif
  return load(p);
}
template <bool M> inline void store(float* p, v16 v, mask16 m) {
  (void)m;
#if defined(__AVX512F__)
  if (M) return _mm512_mask_storeu_ps(p, m, (__m512)v);
#endif
  store(p, v);
}
inline v16 splat(float f) { return v16{} + f; }

template <int A> inline v16 act(v16 v, v16 lo, v16 hi) {
  if (A == 1) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
  }
  if (A == 3) {
    const v16 zero = v16{}, six = splat(6.0f);
    v16 t = v + splat(3.0f);
    t = t < zero ? zero : t;
    t = t > six ? six : t;
    v = v * t / six;
  }
  return v;
}

template <int A> inline float act1(float v, float lo, float hi) {
  if (A == 1) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
  }
  if (A == 3) {
    float t = v + 3.0f;
    t = t < 0.0f ? 0.0f : t;
    t = t > 6.0f ? 6.0f : t;
    v = v * t / 6.0f;
  }
  return v;
}

// NOTE: the activation applied as each output is stored (silu runs over the stored row)
constexpr int stored(int oa) { return oa == 2 ? 0 : oa; }

// NOTE: one fused multiply-add per tap where the CPU has it (the conv contract's rounding;
// the translation unit is built with -ffp-contract=off, which keeps a*b+c unfused)
inline v16 madd(v16 a, v16 b, v16 c) {
#if defined(__AVX512F__)
  return __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4);
#else
  return a * b + c;
#endif
}

struct Args {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  i64 n, h, w_, c, oh, ow, pt, pl;
  float ilo, ihi, olo, ohi;
  float* rows;
  float* pool;
};

// One output row's sums per channel, over its columns in order.
inline void row_sums(const Args& a, const float* yr, float* rs) {
  for (i64 c = 0; c < a.c; ++c) rs[c] = 0.0f;
  for (i64 o = 0; o < a.ow; ++o) {
    const float* yo = yr + o * a.c;
#pragma omp simd
    for (i64 c = 0; c < a.c; ++c) rs[c] += yo[c];
  }
}

// Each image's row sums, in row order, divided by its pixels.
inline void pooled_means(const Args& a) {
  const float pixels = (float)(a.oh * a.ow);
  for (i64 n = 0; n < a.n; ++n) {
    float* pn = a.pool + n * a.c;
    for (i64 c = 0; c < a.c; ++c) pn[c] = 0.0f;
    for (i64 r = 0; r < a.oh; ++r) {
      const float* rs = a.rows + (n * a.oh + r) * a.c;
#pragma omp simd
      for (i64 c = 0; c < a.c; ++c) pn[c] += rs[c];
    }
    for (i64 c = 0; c < a.c; ++c) pn[c] = pn[c] / pixels;
  }
}

// One output pixel of 16 channels at column ``o`` (every tap checked against the borders).
template <int K, int S, int IA, int OA, bool M>
inline void pixel(const Args& a, const float* xn, float* yr, i64 r, i64 o, i64 c, mask16 m) {
  v16 acc = a.b ? load<M>(a.b + c, m) : v16{};
  const v16 ilo = splat(a.ilo), ihi = splat(a.ihi);
  for (int kh = 0; kh < K; ++kh) {
    const i64 ih = r * S - a.pt + kh;
    if (ih < 0 || ih >= a.h) continue;
    for (int kw = 0; kw < K; ++kw) {
      const i64 iw = o * S - a.pl + kw;
      if (iw < 0 || iw >= a.w_) continue;
      const v16 xv = act<IA>(load<M>(xn + (ih * a.w_ + iw) * a.c + c, m), ilo, ihi);
      acc = madd(xv, load<M>(a.w + (kh * K + kw) * a.c + c, m), acc);
    }
  }
  store<M>(yr + o * a.c + c, act<stored(OA)>(acc, splat(a.olo), splat(a.ohi)), m);
}

// P interior output pixels of 16 channels from column ``o`` (every tap column in bounds).
template <int K, int S, int IA, int OA, int P, bool M>
inline void block(const Args& a, const float* xn, float* yr, i64 r, i64 o, i64 c, mask16 m) {
  constexpr int COLS = (P - 1) * S + K;
  const v16 bias = a.b ? load<M>(a.b + c, m) : v16{};
  const v16 ilo = splat(a.ilo), ihi = splat(a.ihi);
  v16 acc[P];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p) acc[p] = bias;
  const i64 iw0 = o * S - a.pl;
#pragma GCC unroll 8
  for (int kh = 0; kh < K; ++kh) {
    const i64 ih = r * S - a.pt + kh;
    if (ih < 0 || ih >= a.h) continue;
    const float* row = xn + (ih * a.w_ + iw0) * a.c + c;
    v16 xs[COLS];
#pragma GCC unroll 32
    for (int j = 0; j < COLS; ++j) xs[j] = act<IA>(load<M>(row + j * a.c, m), ilo, ihi);
#pragma GCC unroll 8
    for (int kw = 0; kw < K; ++kw) {
      const v16 wv = load<M>(a.w + (kh * K + kw) * a.c + c, m);
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) acc[p] = madd(xs[p * S + kw], wv, acc[p]);
    }
  }
  const v16 olo = splat(a.olo), ohi = splat(a.ohi);
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p) {
    store<M>(yr + (o + p) * a.c + c, act<stored(OA)>(acc[p], olo, ohi), m);
  }
}

// One row's columns for the 16 channels (``M``: the lanes of ``m``) from ``c``: the border
// pixels one at a time, the interior in blocks of P, then of 4, 2 and 1.
template <int K, int S, int IA, int OA, int P, bool M>
inline void columns(const Args& a, const float* xn, float* yr, i64 r, i64 c, mask16 m, i64 lo,
                    i64 hi) {
  i64 o = 0;
  for (; o < lo; ++o) pixel<K, S, IA, OA, M>(a, xn, yr, r, o, c, m);
  for (; o + P <= hi; o += P) block<K, S, IA, OA, P, M>(a, xn, yr, r, o, c, m);
  if (P > 4 && o + 4 <= hi) {
    block<K, S, IA, OA, 4, M>(a, xn, yr, r, o, c, m);
    o += 4;
  }
  if (P > 2 && o + 2 <= hi) {
    block<K, S, IA, OA, 2, M>(a, xn, yr, r, o, c, m);
    o += 2;
  }
  for (; o < hi; ++o) block<K, S, IA, OA, 1, M>(a, xn, yr, r, o, c, m);
  for (; o < a.ow; ++o) pixel<K, S, IA, OA, M>(a, xn, yr, r, o, c, m);
}

// P pixels from column ``o`` (pixel: one, its taps checked) for every channel vector in turn.
template <int K, int S, int IA, int OA, int P>
inline void block_all(const Args& a, const float* xn, float* yr, i64 r, i64 o, i64 cv, mask16 rest) {
  for (i64 c = 0; c < cv; c += 16) block<K, S, IA, OA, P, false>(a, xn, yr, r, o, c, 0);
#if defined(__AVX512F__)
  if (cv < a.c) block<K, S, IA, OA, P, true>(a, xn, yr, r, o, cv, rest);
#endif
}

template <int K, int S, int IA, int OA>
inline void pixel_all(const Args& a, const float* xn, float* yr, i64 r, i64 o, i64 cv, mask16 rest) {
  for (i64 c = 0; c < cv; c += 16) pixel<K, S, IA, OA, false>(a, xn, yr, r, o, c, 0);
#if defined(__AVX512F__)
  if (cv < a.c) pixel<K, S, IA, OA, true>(a, xn, yr, r, o, cv, rest);
#endif
}

// One row's columns as columns() computes them, each block of pixels for all the channel vectors
// before the next block (a map of few channels: a pixel's channels are read as one stream, where
// a pass per 16 channels read every fourth line of a 64-channel map's rows; the tail of a CPU
// without AVX-512 is tail()'s).
template <int K, int S, int IA, int OA, int P>
inline void row_by_pixels(const Args& a, const float* xn, float* yr, i64 r, i64 cv, mask16 rest,
                          i64 lo, i64 hi) {
  i64 o = 0;
  for (; o < lo; ++o) pixel_all<K, S, IA, OA>(a, xn, yr, r, o, cv, rest);
  for (; o + P <= hi; o += P) block_all<K, S, IA, OA, P>(a, xn, yr, r, o, cv, rest);
  if (P > 4 && o + 4 <= hi) {
    block_all<K, S, IA, OA, 4>(a, xn, yr, r, o, cv, rest);
    o += 4;
  }
  if (P > 2 && o + 2 <= hi) {
    block_all<K, S, IA, OA, 2>(a, xn, yr, r, o, cv, rest);
    o += 2;
  }
  for (; o < hi; ++o) block_all<K, S, IA, OA, 1>(a, xn, yr, r, o, cv, rest);
  for (; o < a.ow; ++o) pixel_all<K, S, IA, OA>(a, xn, yr, r, o, cv, rest);
}

// The channels past the last multiple of 16, one at a time (a CPU without AVX-512).
template <int K, int S, int IA, int OA>
inline void tail(const Args& a, const float* xn, float* yr, i64 r, i64 c0) {
  for (i64 o = 0; o < a.ow; ++o) {
    for (i64 c = c0; c < a.c; ++c) {
      float acc = a.b ? a.b[c] : 0.0f;
      for (int kh = 0; kh < K; ++kh) {
        const i64 ih = r * S - a.pt + kh;
        if (ih < 0 || ih >= a.h) continue;
        for (int kw = 0; kw < K; ++kw) {
          const i64 iw = o * S - a.pl + kw;
          if (iw < 0 || iw >= a.w_) continue;
          const float xv = act1<IA>(xn[(ih * a.w_ + iw) * a.c + c], a.ilo, a.ihi);
          acc = __builtin_fmaf(xv, a.w[(kh * K + kw) * a.c + c], acc);
        }
      }
      yr[o * a.c + c] = act1<stored(OA)>(acc, a.olo, a.ohi);
    }
  }
}

template <int K, int S, int IA, int OA, int P, bool BY_PIXELS>
void conv(const Args& a) {
  // NOTE: interior columns [lo, hi): o*S - pl >= 0 and o*S - pl + K <= w
  i64 lo = (a.pl + S - 1) / S;
  i64 hi = a.w_ + a.pl >= K ? (a.w_ + a.pl - K) / S + 1 : 0;
  if (lo > a.ow) lo = a.ow;
  if (hi > a.ow) hi = a.ow;
  if (hi < lo) hi = lo;
  const i64 cv = a.c / 16 * 16;
  const i64 rows = a.n * a.oh;
  const mask16 rest = (mask16)((1u << (a.c - cv)) - 1);
  // NOTE: split wherever each thread gets 2048 outputs or more: the rows a thread computes are
  // about those of the pixels the 1x1 call before it wrote on that thread (its pixels split
  // the same way), while a call run on one thread reads the other threads' halves from their
  // caches (EfficientNet-B0 at two threads: about 5-11% of a call, benchmarks/RESULTS.md)
  const i64 split = (i64)omp_get_max_threads();
#pragma omp parallel for schedule(static) if (split > 1 && rows * a.ow * a.c >= split << 11)
  for (i64 nr = 0; nr < rows; ++nr) {
    const i64 r = nr % a.oh;
    const float* xn = a.x + (nr / a.oh) * a.h * a.w_ * a.c;
    float* yr = a.y + nr * a.ow * a.c;
    if (BY_PIXELS) {
      row_by_pixels<K, S, IA, OA, P>(a, xn, yr, r, cv, rest, lo, hi);
    } else {
      for (i64 c = 0; c < cv; c += 16) {
        columns<K, S, IA, OA, P, false>(a, xn, yr, r, c, 0, lo, hi);
      }
#if defined(__AVX512F__)
      if (cv < a.c) columns<K, S, IA, OA, P, true>(a, xn, yr, r, cv, rest, lo, hi);
#endif
    }
#if !defined(__AVX512F__)
    if (cv < a.c) tail<K, S, IA, OA>(a, xn, yr, r, cv);
#endif
    if (OA == 2) {
      const i64 m = a.ow * a.c;
#pragma omp simd
      for (i64 i = 0; i < m; ++i) yr[i] = yr[i] / (1.0f + expf(-yr[i]));
    }
    if (a.pool) row_sums(a, yr, a.rows + nr * a.c);
  }
  if (a.pool) pooled_means(a);
}

template <int K, int S, int IA, int OA>
int entry(const int64_t* p, const float* f) {
  Args a{(const float*)p[0], (const float*)p[1], (const float*)p[2], (float*)p[3],
         p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], f[0], f[1], f[2], f[3],
         (float*)p[12], (float*)p[13]};
  constexpr int P = (S == 1 || K == 3) ? 8 : 4;
  // NOTE: a map of at most 128 channels runs each block of pixels for all its channels (a
  // pixel's channels read as one stream: 64 channels at 112x112, stride 2, 124 -> 95 us a call),
  // a wider one 16 channels at a time over the row (by blocks of pixels, 480-1152 channels at
  // 14x14 and 7x7 ran up to 10% slower in the kernel bench). Two instantiations: one function
  // holding both orders ran the wide maps 2-5% slower.
  if (a.c <= 128) {
    conv<K, S, IA, OA, P, true>(a);
  } else {
    conv<K, S, IA, OA, P, false>(a);
  }
  return 0;
}
}  // namespace dw
