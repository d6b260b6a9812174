// How a backend's op overrides, made from kernels/op_list.h, call the op's twin:
//
//   ret name params override { return call_twin<OpId::name>(*this, twin, args...); }
//
// call_twin makes the contract's checks of the op's Tensor arguments, then calls the
// twin with each Tensor turned into the element pointer the twin's parameter asks for
// (T*, const T*, float*, ...) once its dtype is checked to be that element's; the other
// arguments pass as they are. So no backend spells out an op's casts: the twin's
// declaration (made from the op's roles) says what each tensor must hold.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "kernels/ops.h"

namespace thpc {

// The contract's checks of an op's Tensor arguments (their sizes), made before either
// backend's twin runs. The twins check their other arguments themselves.
template <OpId op, typename... Args>
void check_tensor_arguments(const Args&... args) {
  if constexpr (op == OpId::row_top_k) check_row_top_k(args...);
}

// A Tensor on its way to a twin's pointer parameter. Null stays null.
class TwinTensor {
 public:
  TwinTensor(const Tensor& tensor, const Backend& backend, OpId op, int position)
      : tensor_(tensor), backend_(backend), op_(op), position_(position) {}

  template <typename Element>
  operator Element*() const {
    if (!tensor_) return nullptr;
    const DType expected = dtype_of<std::remove_const_t<Element>>();
    if (tensor_.dtype != expected) wrong_dtype(expected);
    return static_cast<Element*>(tensor_.data);
  }

 private:
  // Throws: "linear_backward: argument 2 is a bf16 tensor where the cuda-bf16 (...)
  // backend takes fp32".
  [[noreturn]] void wrong_dtype(DType expected) const;

  Tensor tensor_;
  const Backend& backend_;
  OpId op_;
  int position_;  // 1-based, among the op's arguments
};

template <typename Arg>
decltype(auto) twin_argument(Arg&& arg, const Backend& backend, OpId op, int position) {
  if constexpr (std::is_same_v<std::decay_t<Arg>, Tensor>) {
    return TwinTensor(arg, backend, op, position);
  } else {
    return std::forward<Arg>(arg);
  }
}

template <OpId op, typename Twin, size_t... positions, typename... Args>
decltype(auto) call_twin_at(const Backend& backend, Twin&& twin,
                            std::index_sequence<positions...>, Args&&... args) {
  return twin(
      twin_argument(std::forward<Args>(args), backend, op, static_cast<int>(positions) + 1)...);
}

// The body of every generated op override: `twin` is the op's twin, or a callable that
// passes its arguments on to it (the CUDA backend's puts its Context first).
template <OpId op, typename Twin, typename... Args>
decltype(auto) call_twin(const Backend& backend, Twin&& twin, Args&&... args) {
  check_tensor_arguments<op>(args...);
  return call_twin_at<op>(backend, twin, std::index_sequence_for<Args...>{},
                          std::forward<Args>(args)...);
}

}  // namespace thpc
