// The C++ prelude every Stax translation unit starts with (plait.codegen.prelude reads it):
// 16-bit float conversions (bitwise as PyTorch's), NaN-propagating min/max, PyTorch's integer
// and floor division, integer power, and the math functions.
// NOTE: no C++ standard headers: they would cost more compile time than the kernels themselves.
#include <stdint.h>
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
// @PLAIT_MATH_DECLS@: plait.codegen.prelude puts the libm declarations here
namespace {
inline float sqrt_(float x) { return __builtin_sqrtf(x); }
inline double sqrt_(double x) { return __builtin_sqrt(x); }
inline float fabs_(float x) { return __builtin_fabsf(x); }
inline double fabs_(double x) { return __builtin_fabs(x); }
inline float trunc_(float x) { return __builtin_truncf(x); }
inline double trunc_(double x) { return __builtin_trunc(x); }
inline float floor_(float x) { return __builtin_floorf(x); }
inline double floor_(double x) { return __builtin_floor(x); }
// NOTE: the sign bit read from the bits (GCC 12 fails to vectorize __builtin_signbit).
inline bool signbit_(float x) { uint32_t u; __builtin_memcpy(&u, &x, 4); return (u >> 31) != 0; }
inline bool signbit_(double x) { uint64_t u; __builtin_memcpy(&u, &x, 8); return (u >> 63) != 0; }
inline float ceil_(float x) { return __builtin_ceilf(x); }
inline double ceil_(double x) { return __builtin_ceil(x); }
inline float rint_(float x) { return __builtin_rintf(x); }
inline double rint_(double x) { return __builtin_rint(x); }
inline float fmod_(float a, float b) { return __builtin_fmodf(a, b); }
inline double fmod_(double a, double b) { return __builtin_fmod(a, b); }
inline float copysign_(float a, float b) { return __builtin_copysignf(a, b); }
inline double copysign_(double a, double b) { return __builtin_copysign(a, b); }
template <class T> inline T max_(T a, T b) { return a < b ? b : a; }
template <class T> inline T min_(T a, T b) { return b < a ? b : a; }
inline float bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16; float f; __builtin_memcpy(&f, &u, 4); return f;
}
inline uint16_t bf16_store(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_round(float f) { return bf16_load(bf16_store(f)); }
inline float f32_bits(uint32_t w) { float f; __builtin_memcpy(&f, &w, 4); return f; }
inline uint32_t bits_f32(float f) { uint32_t w; __builtin_memcpy(&w, &f, 4); return w; }
inline float f16_load(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result =
      sign | (two_w < (1u << 27) ? bits_f32(denormalized) : bits_f32(normalized));
  return f32_bits(result);
}
inline uint16_t f16_store(float f) {
  float base = (fabs_(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits_f32(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_f32(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
inline float f16_round(float f) { return f16_load(f16_store(f)); }
template <class T> inline T max_nan(T a, T b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <class T> inline T min_nan(T a, T b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}
// NOTE: fmax/fmin ignore a NaN operand; of two equal values (+0, -0) the first, as eager.
template <class T> inline T fmax(T a, T b) {
  return a != a ? b : (b != b ? a : (a < b ? b : a));
}
template <class T> inline T fmin(T a, T b) {
  return a != a ? b : (b != b ? a : (b < a ? b : a));
}
template <class T> inline T fdiv_floor(T a, T b) {
  if (b == 0) return a / b;
  T mod = fmod_(a, b);
  T div = (a - mod) / b;
  if ((mod != 0) && ((b < 0) != (mod < 0))) div -= 1;
  T floordiv;
  if (div != 0) { floordiv = floor_(div); if (div - floordiv > T(0.5)) floordiv += 1; }
  else floordiv = copysign_(T(0), a / b);
  return floordiv;
}
// Float to integer as PyTorch's CPU casts (c10::convert) compute it: int8, int16 and int32 through
// a 32-bit conversion, uint8 and int64 through a 64-bit one. NaN and values out of range give what
// the machine's conversion instruction gives (x86: the lowest integer; elsewhere, as AArch64's:
// saturated, NaN 0), written out: a bare cast of such a value is undefined behaviour, which the
// compiler folds as it likes (NaN to 0) or narrows through another width.
// I: int32_t or int64_t (the wide type); its range is [-2^(bits-1), 2^(bits-1)), exact in F.
template <class I, class F> inline I f2i(F x) {
  const uint64_t sign = uint64_t(1) << (sizeof(I) * 8 - 1);
  const F end = F(sign);
  const I lowest = (I)sign;
#if defined(__x86_64__) || defined(__i386__)
  return (x >= -end && x < end) ? (I)x : lowest;
#else
  return x != x ? I(0) : x >= end ? I(~lowest) : x < -end ? lowest : (I)x;
#endif
}
template <class T> inline bool signed_() { return T(-1) < T(0); }
template <class T> inline T idiv_trunc(T a, T b) {
  if (b == 0) return 0;
  if (signed_<T>() && b == T(-1)) return (T)(0 - a);
  return (T)(a / b);
}
template <class T> inline T idiv_floor(T a, T b) {
  if (b == 0) return 0;
  if (signed_<T>() && b == T(-1)) return (T)(0 - a);
  T q = (T)(a / b), r = (T)(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <class T> inline T imod_trunc(T a, T b) {
  if (b == 0 || (signed_<T>() && b == T(-1))) return 0;
  return (T)(a % b);
}
template <class T> inline T imod_floor(T a, T b) {
  T r = imod_trunc<T>(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
template <class T> inline T ipow(T a, T b) {
  if (signed_<T>() && b < 0) {
    if (a == 1) return 1;
    if (a == -1) return ((0 - b) % 2) ? (T)-1 : (T)1;
    return 0;
  }
  T result = 1;
  while (b) { if (b & 1) result = (T)(result * a); b = (T)(b / 2); a = (T)(a * a); }
  return result;
}
inline int64_t clamp_i64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
}  // namespace
