// Compile-time check of torch_layout.h against the THPVariable of the PyTorch headers it is
// compiled with (tests/guards/test_native_sources.py compiles it; it is never linked).
#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>

#include "torch_layout.h"

#if PLAIT_LAYOUT_MAYBE_OWNED
static_assert(offsetof(plait_layout::Var, borrowed) == offsetof(THPVariable, cdata),
              "the MaybeOwned tensor starts where THPVariable::cdata does");
static_assert(sizeof(c10::MaybeOwned<at::Tensor>) ==
                  offsetof(plait_layout::Var, own) + sizeof(void*) - offsetof(THPVariable, cdata),
              "MaybeOwned<at::Tensor> is a flag and one pointer");
#else
static_assert(offsetof(plait_layout::Var, impl) == offsetof(THPVariable, cdata),
              "the TensorImpl pointer is where THPVariable::cdata is");
static_assert(sizeof(at::Tensor) == sizeof(c10::TensorImpl*),
              "at::Tensor is one TensorImpl pointer");
#endif
