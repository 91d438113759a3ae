// im2col and col2im of a contiguous NCHW float32 map, for a convolution's backward run as GEMMs
// (plait.codegen.gemm_conv puts it in a translation unit after the prelude, with its extern "C"
// entries). One group, any kernel size, stride, padding and dilation.
//
// Layouts: x and dx [N][C][H][W]; cols and dcols [N*OH*OW][C*KH*KW], a row per output pixel
// (n, oh, ow), its columns (c, kh, kw) in the order of the weight viewed as [O][C*KH*KW].
// A tap that falls in the padding reads 0 (im2col) and is never summed (col2im): dx[n][c][h][w]
// is the sum over the in-bounds taps that read it, in (oh, ow, kh, kw) order.
//
// Work: a table of each (output pixel, tap)'s offset in a channel plane (-1: padding), then one
// (image, block of channels) per task, OpenMP-parallel: a task owns its planes of dx and its
// columns of cols, so tasks never write the same memory.
namespace i2c {
typedef int64_t i64;

struct Geom {
  i64 n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  i64 taps() const { return kh * kw; }
  i64 pixels() const { return oh * ow; }
};

inline Geom geom(const int64_t* p) {
  return Geom{p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13],
              p[14], p[15]};
}

// NOTE: offsets of each (output pixel, tap) in a plane, -1 where the tap is padding
inline void table(const Geom& g, i64* off) {
  for (i64 y = 0; y < g.oh; y++)
    for (i64 x = 0; x < g.ow; x++)
      for (i64 i = 0; i < g.kh; i++)
        for (i64 j = 0; j < g.kw; j++) {
          i64 h = y * g.sh - g.ph + i * g.dh, w = x * g.sw - g.pw + j * g.dw;
          bool in = h >= 0 && h < g.h && w >= 0 && w < g.w;
          off[((y * g.ow + x) * g.kh + i) * g.kw + j] = in ? h * g.w + w : -1;
        }
}

const i64 BLOCK = 16;  // NOTE: channels per task

// p: x, cols, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, table (i64[OH*OW*KH*KW])
inline int im2col(const int64_t* p, const float*) {
  const float* x = (const float*)p[0];
  float* cols = (float*)p[1];
  Geom g = geom(p);
  i64* off = (i64*)p[16];
  table(g, off);
  i64 kk = g.taps(), pix = g.pixels(), row = g.c * kk, blocks = (g.c + BLOCK - 1) / BLOCK;
  i64 tasks = g.n * blocks;
#pragma omp parallel for schedule(static) if (g.n * pix * row >= (1 << 16))
  for (i64 t = 0; t < tasks; t++) {
    i64 n = t / blocks, c0 = (t % blocks) * BLOCK, c1 = c0 + BLOCK < g.c ? c0 + BLOCK : g.c;
    for (i64 m = 0; m < pix; m++) {
      const i64* o = off + m * kk;
      float* dst = cols + (n * pix + m) * row;
      for (i64 c = c0; c < c1; c++) {
        const float* plane = x + (n * g.c + c) * g.h * g.w;
        float* d = dst + c * kk;
        for (i64 k = 0; k < kk; k++) d[k] = o[k] >= 0 ? plane[o[k]] : 0.0f;
      }
    }
  }
  return 0;
}

// p: dcols, dx, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, table
inline int col2im(const int64_t* p, const float*) {
  const float* cols = (const float*)p[0];
  float* dx = (float*)p[1];
  Geom g = geom(p);
  i64* off = (i64*)p[16];
  table(g, off);
  i64 kk = g.taps(), pix = g.pixels(), row = g.c * kk, plane = g.h * g.w;
  i64 blocks = (g.c + BLOCK - 1) / BLOCK, tasks = g.n * blocks;
#pragma omp parallel for schedule(static) if (g.n * pix * row >= (1 << 16))
  for (i64 t = 0; t < tasks; t++) {
    i64 n = t / blocks, c0 = (t % blocks) * BLOCK, c1 = c0 + BLOCK < g.c ? c0 + BLOCK : g.c;
    float* out = dx + (n * g.c + c0) * plane;
    for (i64 e = 0; e < (c1 - c0) * plane; e++) out[e] = 0.0f;
    for (i64 m = 0; m < pix; m++) {
      const i64* o = off + m * kk;
      const float* src = cols + (n * pix + m) * row;
      for (i64 c = c0; c < c1; c++) {
        float* pl = dx + (n * g.c + c) * plane;
        const float* s = src + c * kk;
        for (i64 k = 0; k < kk; k++)
          if (o[k] >= 0) pl[o[k]] += s[k];
      }
    }
  }
  return 0;
}
}  // namespace i2c
