#include "kernels/cpu/onednn_library.h"

#include <sstream>

#if THPC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

namespace thpc::cpu {

#if THPC_HAVE_ONEDNN

namespace {

[[maybe_unused]] std::string unnamed_isa(dnnl::cpu_isa isa) {
  std::ostringstream text;
  text << "isa 0x" << std::hex << static_cast<unsigned>(isa);
  return text.str();
}

// The instruction set oneDNN's kernels use, by the names both oneDNN 2 and 3 have. They
// are x86-64's: elsewhere oneDNN answers with its own bits under the same type (an aarch64
// CPU with Advanced SIMD alone would read as "sse41"), so the CPU's vector unit is named
// instead, as the kernel reports it.
std::string isa_name(dnnl::cpu_isa isa) {
#if defined(__aarch64__)
  static_cast<void>(isa);
  if ((::getauxval(AT_HWCAP) & HWCAP_SVE) == 0) return "aarch64 asimd";
  const int vector_length = ::prctl(PR_SVE_GET_VL);
  if (vector_length < 0) return "aarch64 sve";
  return "aarch64 sve " + std::to_string(8 * (vector_length & PR_SVE_VL_LEN_MASK)) + "-bit";
#elif defined(__x86_64__)
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return unnamed_isa(isa);
  }
#else
  return unnamed_isa(isa);
#endif
}

}  // namespace

bool onednn_built() { return true; }

std::string onednn_version_and_isa() {
  const dnnl_version_t* version = dnnl_version();
  std::ostringstream text;
  text << "oneDNN " << version->major << "." << version->minor << "." << version->patch << ", "
       << isa_name(dnnl::get_effective_cpu_isa());
  return text.str();
}

bool onednn_runs_avx512() {
#if !defined(__x86_64__)
  return false;  // the bits below are x86-64's (see isa_name)
#else
  // The instruction sets are bit sets, each containing those it extends (avx512_core_bf16
  // = 0xe7 holds avx512_core = 0x27), in oneDNN 2 and 3 alike.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512_core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512_core) == avx512_core;
#endif
}

bool onednn_gemm_is_signal_safe() {
  const dnnl_version_t* v = dnnl_version();
  const int version = v->major * 10000 + v->minor * 100 + v->patch;
  return version >= 31102;  // 3.11.2 and 3.12 have the fix
}

#else

bool onednn_built() { return false; }
std::string onednn_version_and_isa() { return ""; }
bool onednn_runs_avx512() { return false; }
bool onednn_gemm_is_signal_safe() { return false; }

#endif

}  // namespace thpc::cpu
