// The CPU reference ops: the specification every other backend is checked against.
//
// Plain loops or a BLAS call, written for clarity. Each op of kernels/op_list.h has its
// twin here, a function template over the element type T, instantiated for float (what
// the CPU backend trains with) and double (what the finite-difference tests use, so a
// gradient check can be tight). Contracts, layouts and the accumulate-into-gradients
// rule are those of kernels/op_list.h; the comments there are the documentation, the
// ones beside each twin only add what is CPU-specific.
//
// The declarations below are made from the op list: the twin of
//   THPC_OP(ret, name, (parameters), (arguments))
// is `template <typename T> ret name(parameters)` with the tensors as T* (Out, ParamOut)
// and const T* (In, ParamIn): one element type for activations and parameters alike.
// A twin is defined in its family's file and followed there by THPC_CPU_TWIN(name),
// which instantiates it for float and double: embedding.cc, linear.cc (BLAS: sgemm /
// dgemm), layernorm.cc, attention.cc, elementwise.cc (ReLU, dropout, residual, row
// copies, sum of squares, scaling), cross_entropy.cc, top_k.cc (the decoder's ranked
// next tokens), adam.cc.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace thpc::cpu {

#define In const T*
#define Out T*
#define ParamIn const T*
#define ParamOut T*
#define THPC_OP(ret, name, params, args) \
  template <typename T>                  \
  ret name params;
#include "kernels/op_list.h"
#undef THPC_OP
#undef In
#undef Out
#undef ParamIn
#undef ParamOut

}  // namespace thpc::cpu

// After a twin's definition, in its family's file: its float and double instantiations.
// A definition whose parameters differ from the list's declaration is another template
// of the same name, and this line then fails to compile ("cannot resolve address of
// overloaded function").
#define THPC_CPU_TWIN(name)                     \
  template decltype(name<float>) name<float>; \
  template decltype(name<double>) name<double>;
