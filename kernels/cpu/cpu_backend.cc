#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/twin_call.h"

namespace thpc {
namespace {

// Peak resident set of this process in bytes (VmHWM of /proc/self/status); -1 where the
// file or the field is missing.
int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return -1;
}

// An op's argument as its twin gets it: a DropoutKey, or an AttentionShape's, with the
// step and stream it draws with read from memory where the key points there
// (key_as_it_runs); any other argument as it is.
template <typename Arg>
decltype(auto) key_read(Arg&& arg) {
  if constexpr (std::is_same_v<std::decay_t<Arg>, DropoutKey>) {
    return key_as_it_runs(arg);
  } else if constexpr (std::is_same_v<std::decay_t<Arg>, AttentionShape>) {
    AttentionShape shape = arg;
    shape.dropout_key = key_as_it_runs(shape.dropout_key);
    return shape;
  } else {
    return std::forward<Arg>(arg);
  }
}

template <typename Twin>
auto with_keys_read(Twin& twin) {
  return [&twin](auto&&... args) -> decltype(auto) {
    return twin(key_read(std::forward<decltype(args)>(args))...);
  };
}

template <typename T>
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return std::string("cpu-") + dtype_name(dtype_of<T>()); }
  bool host_memory() const override { return true; }
  // Packing the weights once per product (about 12 MB a base layer) costs what some 15
  // rows' products do; 64 leaves a margin for the smaller products' lower rate. (The
  // first 40 lines of newstest2014, one batch: 3,840 rows padded, 1,934 in 5 groups.)
  int encoder_group_cost_rows() const override { return 64; }
  // The fused ops compute the separate ops' bits here (AddNorm.*, LinearRelu.*,
  // ReluBiasBackward.*, FusedOps.* in test_model).
  bool fused_ops_by_default() const override { return true; }
  DType param_dtype() const override { return dtype_of<T>(); }
  DType compute_dtype() const override { return dtype_of<T>(); }

  Tensor alloc(DType dtype, int64_t numel) override {
    THPC_CHECK(dtype == dtype_of<T>(), "the " << name() << " backend holds no "
                                              << dtype_name(dtype) << " tensors");
    THPC_CHECK(numel >= 0, "negative size " << numel);
    Tensor t;
    t.dtype = dtype;
    t.numel = numel;
    // 64-byte alignment: a cache line, and what vectorised BLAS kernels prefer.
    const size_t bytes = ((static_cast<size_t>(numel) * sizeof(T) + 63) / 64) * 64;
    t.data = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
    // Running out of memory is the sizes' doing (a batch budget, a model), not a bug.
    if (t.data == nullptr) {
      THPC_FAIL(out_of_memory_message("cannot allocate " + std::to_string(bytes) +
                                      " more bytes of host memory"));
    }
    return t;
  }
  void free(Tensor& tensor) override {
    std::free(tensor.data);
    tensor = Tensor{};
  }
  int32_t* alloc_ids(int64_t count) override {
    auto* ids = static_cast<int32_t*>(std::malloc(sizeof(int32_t) * (count > 0 ? count : 1)));
    if (ids == nullptr) {
      THPC_FAIL(out_of_memory_message("cannot allocate " + std::to_string(count) +
                                      " token ids in host memory"));
    }
    return ids;
  }
  void free_ids(int32_t*& ids) override {
    std::free(ids);
    ids = nullptr;
  }
  // An empty tensor may have a null pointer (an empty host vector's data() too), and
  // memcpy/memset with a null pointer are undefined even for zero bytes (UBSan's
  // nonnull check): zero-sized transfers return first, as cudaMemcpy's do nothing.
  void zero(Tensor t) override {
    if (t.numel > 0) std::memset(t.data, 0, t.numel * sizeof(T));
  }
  void copy(Tensor dst, Tensor src) override {
    THPC_CHECK(dst.numel == src.numel, "copy of " << src.numel << " into " << dst.numel);
    if (src.numel > 0) std::memmove(dst.data, src.data, src.numel * sizeof(T));
  }
  void upload(Tensor dst, const void* host) override {
    if (dst.numel > 0) std::memcpy(dst.data, host, dst.numel * sizeof(T));
  }
  void download(void* host, Tensor src) override {
    if (src.numel > 0) std::memcpy(host, src.data, src.numel * sizeof(T));
  }
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
    if (count > 0) std::memcpy(dst, host, count * sizeof(int32_t));
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    if (count > 0) std::memcpy(host, src, count * sizeof(int32_t));
  }
  void synchronize() override {}
  int64_t peak_memory_bytes() const override { return peak_resident_bytes(); }

  // The ops: each entry of kernels/op_list.h calls its twin cpu::NAME<T> on this
  // backend's tensors, their dtypes checked (kernels/twin_call.h).
// A DropoutKey (on its own or in an AttentionShape) whose step and stream are in memory
// (DropoutKey::inputs) reaches the twin with them read, as the op runs: this backend's
// memory is the host's.
#define THPC_OP(ret, name, params, args)                                                   \
  ret name params override {                                                              \
    return call_twin<OpId::name>(*this, with_keys_read(cpu::name<T>), THPC_UNPAREN args); \
  }
#include "kernels/op_list.h"
#undef THPC_OP
};

}  // namespace

namespace {
std::atomic<int> cpu_thread_count{0};  // 0: not set, OpenMP's default
}  // namespace

void set_cpu_threads(int threads) {
  THPC_CHECK(threads >= 1, "CPU threads must be at least 1, not " << threads);
  cpu_thread_count.store(threads);
  cpu::set_gemm_threads(threads);  // the same OpenMP pool the ops' loops use
}

namespace cpu {
int cpu_threads() {
  const int threads = cpu_thread_count.load();
  return threads > 0 ? threads : omp_get_max_threads();
}
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(DType dtype) {
  // THPC_CPU_GEMM read, and a value it does not know reported, here, not from the first
  // product (which may run inside a parallel loop, where nothing may throw).
  cpu::gemm_library();
  switch (dtype) {
    case DType::F32: return std::make_unique<CpuBackend<float>>();
    case DType::F64: return std::make_unique<CpuBackend<double>>();
    default: THPC_FAIL("the CPU backend computes in fp32 or fp64, not " << dtype_name(dtype));
  }
}

}  // namespace thpc
