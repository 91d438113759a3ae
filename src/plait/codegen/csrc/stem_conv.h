// A convolution of few input channels (a network's stem: an image's three) read from its
// contiguous (NCHW) input where it lies, the zero pad before it folded in, written
// channels_last, with its bias and activation (plait.codegen.stem_conv puts it in a translation
// unit after the prelude and csrc/pointwise.h, whose exp16 and silu16 it uses, with one extern
// "C" entry per activation).
//
// As an implicit matrix product: each output pixel's K = Cin*KH*KW taps (in the weight's own
// order: channel, row, column) times the weight packed as w [K][OP] (OP: the output channels O
// rounded up to 16, the padding zero); ``off`` [K] holds each tap's offset from the pixel's
// window corner in the input. Each output is its bias plus the products of its in-bounds taps
// in tap order, by fused multiply-adds (a padded tap is skipped: its product is zero for a
// finite weight; the caller runs eager's convolution otherwise), then activated: 0 none, 1
// clamp (NaN kept), 2 silu.
//
// Work: one output row at a time (OpenMP-parallel over rows of large calls); its interior
// pixels (every tap in bounds) MR at a time by NB vectors of 16 output channels held in
// registers, the border pixels one at a time with each tap checked.
namespace sc {
typedef int64_t i64;

struct Args {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  const i64* off;
  i64 n, cin, h, wd, o, op, oh, ow, kh, kw, s, pt, pl;
  float lo, hi;
};

template <int ACT>
inline __m512 finish(__m512 v, float lo, float hi) {
  if (ACT == 1) {
    const __m512 l = _mm512_set1_ps(lo), u = _mm512_set1_ps(hi);
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, l, _CMP_LT_OQ), v, l);
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, u, _CMP_GT_OQ), v, u);
  }
  if (ACT == 2) v = pw::silu16(v, _mm512_set1_ps(1.0f));
  if (ACT == 3) v = pw::hardswish16(v);
  return v;
}

// MR interior pixels from column c0 of output row ``yr`` (window corners ``corner`` apart
// from ``x0``), output channels [j0, j0 + 16 NB).
template <int MR, int NB, int ACT>
inline void interior(const Args& a, const float* x0, float* yr, i64 c0, i64 j0, __mmask16 tail) {
  const i64 s = a.s, o = a.o, op = a.op, kk = a.cin * a.kh * a.kw;
  const i64* off = a.off;
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
    const __m512 bv = a.b ? _mm512_maskz_loadu_ps(mk, a.b + j0 + j * 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) acc[m][j] = bv;
  }
  const float* corner = x0 + c0 * s;
  const float* wp = a.w + j0;
  for (i64 k = 0; k < kk; ++k) {
    const float* at = corner + off[k];
    __m512 wv[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_ps(wp + j * 16);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(at[m * s]);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
    }
    wp += op;
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
      _mm512_mask_storeu_ps(yr + (c0 + m) * o + j0 + j * 16, mk, finish<ACT>(acc[m][j], a.lo, a.hi));
    }
  }
}

// One pixel at column c of output row r with any of its taps out of bounds.
template <int NB, int ACT>
inline void border(const Args& a, const float* xn, float* yr, i64 r, i64 c, i64 j0,
                   __mmask16 tail) {
  __m512 acc[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
    acc[j] = a.b ? _mm512_maskz_loadu_ps(mk, a.b + j0 + j * 16) : _mm512_setzero_ps();
  }
  const i64 ih0 = r * a.s - a.pt, iw0 = c * a.s - a.pl;
  i64 k = 0;
  for (i64 ci = 0; ci < a.cin; ++ci) {
    for (i64 i = 0; i < a.kh; ++i) {
      for (i64 jj = 0; jj < a.kw; ++jj, ++k) {
        const i64 ih = ih0 + i, iw = iw0 + jj;
        if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.wd) continue;
        const __m512 xb = _mm512_set1_ps(xn[(ci * a.h + ih) * a.wd + iw]);
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          acc[j] = _mm512_fmadd_ps(xb, _mm512_loadu_ps(a.w + k * a.op + j0 + j * 16), acc[j]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mk = j < NB - 1 ? (__mmask16)0xffff : tail;
    _mm512_mask_storeu_ps(yr + c * a.o + j0 + j * 16, mk, finish<ACT>(acc[j], a.lo, a.hi));
  }
}

template <int NB, int ACT>
inline void row(const Args& a, const float* xn, float* yr, i64 r, i64 lo, i64 hi, i64 j0,
                __mmask16 tail) {
  constexpr int MR = NB == 4 ? 6 : 8;
  const i64 ih0 = r * a.s - a.pt;
  const bool inside = ih0 >= 0 && ih0 + a.kh <= a.h;
  i64 c = 0;
  if (inside) {
    const float* x0 = xn + ih0 * a.wd - a.pl;
    for (; c < lo; ++c) border<NB, ACT>(a, xn, yr, r, c, j0, tail);
    for (; c + MR <= hi; c += MR) interior<MR, NB, ACT>(a, x0, yr, c, j0, tail);
    for (; c < hi; ++c) interior<1, NB, ACT>(a, x0, yr, c, j0, tail);
  }
  for (; c < a.ow; ++c) border<NB, ACT>(a, xn, yr, r, c, j0, tail);
}

extern "C" int omp_get_max_threads(void);

template <int ACT>
void conv(const Args& a) {
  // NOTE: interior columns [lo, hi): c*s - pl >= 0 and c*s - pl + kw <= wd
  i64 lo = (a.pl + a.s - 1) / a.s;
  i64 hi = a.wd + a.pl >= a.kw ? (a.wd + a.pl - a.kw) / a.s + 1 : 0;
  if (lo > a.ow) lo = a.ow;
  if (hi > a.ow) hi = a.ow;
  if (hi < lo) hi = lo;
  const i64 rows = a.n * a.oh;
  const bool big = rows * a.ow * a.o * a.cin * a.kh * a.kw >= (1 << 20);
#pragma omp parallel for schedule(static) if (big && omp_get_max_threads() > 1)
  for (i64 nr = 0; nr < rows; ++nr) {
    const i64 r = nr % a.oh;
    const float* xn = a.x + (nr / a.oh) * a.cin * a.h * a.wd;
    float* yr = a.y + nr * a.ow * a.o;
    for (i64 j0 = 0; j0 < a.o; j0 += 64) {
      const i64 n = a.o - j0 < 64 ? a.o - j0 : 64;
      const int vecs = (int)((n + 15) / 16), last = (int)(n - (vecs - 1) * 16);
      const __mmask16 tail = (__mmask16)((1u << last) - 1);
      if (vecs == 4) row<4, ACT>(a, xn, yr, r, lo, hi, j0, tail);
      else if (vecs == 3) row<3, ACT>(a, xn, yr, r, lo, hi, j0, tail);
      else if (vecs == 2) row<2, ACT>(a, xn, yr, r, lo, hi, j0, tail);
      else row<1, ACT>(a, xn, yr, r, lo, hi, j0, tail);
    }
  }
}

template <int ACT>
int entry(const int64_t* p, const float* f) {
  Args a{(const float*)p[0], (const float*)p[1], (const float*)p[2], (float*)p[3],
         (const i64*)p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14],
         p[15], p[16], p[17], f[0], f[1]};
  conv<ACT>(a);
  return 0;
}
}  // namespace sc
