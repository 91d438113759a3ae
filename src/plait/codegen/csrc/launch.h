// One call running a straight run of a program's native kernel calls and generated kernels
// (plait.codegen.native_launch puts it in a translation unit after the prelude, with one
// extern "C" entry).
//
// p: [steps, step count, checks, check count]. A step is four words: a C function, its int64
// array, its float array and its kind: 0 a native kernel's entry (the very arrays the entry's
// own call would pass), 1 a generated kernel (its pointers in the runner's table; nonzero where
// an integer was divided by zero). A check is three words: an address, a byte count and the
// bytes expected there (a caller's weight's first elements as its prepared copy was made from
// them).
//
// Returns 1, running nothing, where a check's bytes differ (the caller then runs the steps one
// by one, which prepare the weight again); 2 where a generated kernel divided by zero (the
// steps after it not run); else runs every step in order and returns 0.
#include <string.h>

namespace nl {
typedef int (*Entry)(const int64_t*, const float*);
typedef int (*Kernel)(void* const*);

inline int entry(const int64_t* p, const float* f) {
  (void)f;
  const int64_t* steps = (const int64_t*)p[0];
  const int64_t* checks = (const int64_t*)p[2];
  for (int64_t i = 0; i < p[3]; ++i) {
    const int64_t* c = checks + 3 * i;
    if (memcmp((const void*)c[0], (const void*)c[2], (size_t)c[1]) != 0) return 1;
  }
  for (int64_t i = 0; i < p[1]; ++i) {
    const int64_t* s = steps + 4 * i;
    if (s[3] == 0) {
      ((Entry)s[0])((const int64_t*)s[1], (const float*)s[2]);
    } else if (((Kernel)s[0])((void* const*)s[1]) != 0) {
      return 2;
    }
  }
  return 0;
}
}  // namespace nl
