// PyTorch's object layout, as the native guard evaluator reads it: every assumption it makes
// about PyTorch's C++ objects is here, and nowhere else.
//
// A Python tensor (torch.Tensor, nn.Parameter) is a THPVariable (torch/csrc/autograd/
// python_variable.h): a PyObject header followed by its at::Tensor, which holds one
// c10::TensorImpl pointer. The evaluator reads that pointer without PyTorch's Python headers
// (they cost seconds of compile time). Checked twice: torch_layout_check.cpp static_asserts this
// mirror against THPVariable (tests/guards/test_native_sources.py compiles it), and
// _plait_guards.configure() compares impl_of(a sample) with the running torch's Tensor._cdata.
#pragma once

#include <Python.h>
#include <c10/core/TensorImpl.h>
#include <torch/version.h>

namespace plait_layout {

// NOTE: torch 2.10 made THPVariable::cdata a plain at::Tensor (one TensorImpl pointer); before,
// a c10::MaybeOwned<at::Tensor>.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 10
#define PLAIT_LAYOUT_MAYBE_OWNED 1
struct Var {
  PyObject_HEAD
  bool borrowed;
  union {
    c10::TensorImpl* const* borrow;
    c10::TensorImpl* own;
  };
};
inline c10::TensorImpl* impl_of(PyObject* o) {
  auto* v = reinterpret_cast<Var*>(o);
  return v->borrowed ? *v->borrow : v->own;
}
#else
#define PLAIT_LAYOUT_MAYBE_OWNED 0
struct Var {
  PyObject_HEAD
  c10::TensorImpl* impl;
};
inline c10::TensorImpl* impl_of(PyObject* o) {
  return reinterpret_cast<Var*>(o)->impl;
}
#endif

// The VersionCounter a tensor's version counter points to, for a prefetch only (a prefetch of a
// wrong address never faults; the checks read the counter through PyTorch's API).
// NOTE: c10::VariableVersion is one intrusive_ptr<VersionCounter> (static_asserted below).
static_assert(sizeof(c10::VariableVersion) == sizeof(void*),
              "c10::VariableVersion is one intrusive pointer");
inline const void* version_counter_of(const c10::TensorImpl* t) {
  return *reinterpret_cast<const void* const*>(&t->version_counter());
}

}  // namespace plait_layout
