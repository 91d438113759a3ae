// A global average pool of a channels_last float32 map (adaptive_avg_pool2d to 1x1, as a
// classifier's head pools the last map): plait.codegen.global_pool puts it in a translation unit
// after the prelude, with one extern "C" entry.
//
// Layouts: x [N][H*W][C], y [N][C]. Each output is its channel's pixels summed in pixel order,
// then divided by H*W (NaN and infinities propagate as in eager's sum). One thread: the map is
// what the call before just wrote, and a call's work is a few microseconds.
namespace gp {
typedef int64_t i64;

inline int entry(const int64_t* p, const float* f) {
  (void)f;
  const float* x = (const float*)p[0];
  float* y = (float*)p[1];
  const i64 n = p[2], hw = p[3], c = p[4];
  const float pixels = (float)hw;
  for (i64 i = 0; i < n; ++i) {
    float* yi = y + i * c;
    const float* xi = x + i * hw * c;
#pragma omp simd
    for (i64 k = 0; k < c; ++k) yi[k] = 0.0f;
    for (i64 q = 0; q < hw; ++q) {
      const float* xq = xi + q * c;
#pragma omp simd
      for (i64 k = 0; k < c; ++k) yi[k] += xq[k];
    }
#pragma omp simd
    for (i64 k = 0; k < c; ++k) yi[k] = yi[k] / pixels;
  }
  return 0;
}
}  // namespace gp
