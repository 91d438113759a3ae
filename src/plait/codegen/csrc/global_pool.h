// A global average pool of a channels_last float32 map (adaptive_avg_pool2d to 1x1, as a
// classifier's head pools the last map): plait.codegen.global_pool puts it in a translation unit
// after the prelude, with one extern "C" entry.
//
// Layouts: x [N][H*W][C], y [N][C]. Each output is its channel's pixels summed in pixel order,
// then divided by H*W (NaN and infinities propagate as in eager's sum).
//
// Work: items of (image, block of 64 channels), OpenMP-parallel over items where a call reads
// 2^17 elements or more (a batch's head; a single image's 7x7 map is a few microseconds on one
// thread); each output is one item's sum in pixel order, the same at any thread count.
namespace gp {
extern "C" int omp_get_max_threads(void);
typedef int64_t i64;
constexpr i64 CB = 64;

inline int entry(const int64_t* p, const float* f) {
  (void)f;
  const float* x = (const float*)p[0];
  float* y = (float*)p[1];
  const i64 n = p[2], hw = p[3], c = p[4];
  const float pixels = (float)hw;
  const i64 blocks = (c + CB - 1) / CB;
  const bool split = omp_get_max_threads() > 1 && n * hw * c >= (i64(1) << 17);
#pragma omp parallel for schedule(static) if (split)
  for (i64 item = 0; item < n * blocks; ++item) {
    const i64 i = item / blocks, k0 = item % blocks * CB;
    const i64 k1 = k0 + CB < c ? k0 + CB : c;
    float* yi = y + i * c;
    const float* xi = x + i * hw * c;
#pragma omp simd
    for (i64 k = k0; k < k1; ++k) yi[k] = 0.0f;
    for (i64 q = 0; q < hw; ++q) {
      const float* xq = xi + q * c;
#pragma omp simd
      for (i64 k = k0; k < k1; ++k) yi[k] += xq[k];
    }
#pragma omp simd
    for (i64 k = k0; k < k1; ++k) yi[k] = yi[k] / pixels;
  }
  return 0;
}
}  // namespace gp
