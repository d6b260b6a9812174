// Choosing and making a backend: `[train] backend = auto | cuda | cpu` and
// `[train] precision = bf16 | fp32`, shared by the trainer and the tools.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/gemm_sweep.h"
#include "kernels/ops.h"

namespace thpc {

struct BackendRequest {
  std::string backend = "auto";    // auto: CUDA when a device is present, else the CPU
  std::string precision = "bf16";  // GPU activations: bf16 | fp32 (the CPU computes in fp32)
  int device = 0;                  // CUDA device index (after CUDA_VISIBLE_DEVICES)
  int cpu_threads = 0;             // CPU threads (ops and BLAS); 0 = OpenMP's default
  // train.cuda_kernels and train.short_attention_max_len: which of its kernels the
  // CUDA backend may take (kernels/ops.h).
  CudaKernelChoice cuda_kernels;
};

// Why no CUDA backend can be made here ("" when one can): built without CUDA, or
// cudaGetDeviceCount failed / found no device. Tests print it when they skip.
std::string cuda_unavailable_reason();

// Whether this build has the CUDA backend (nvcc at configure time, TRANSFORMER_CUDA on).
bool built_with_cuda();

// How often this process has launched the CUDA short-sentence attention
// (kernels/cuda/short_attention.cuh); 0 without CUDA. Its twin tests check that the path
// they compare was the one taken, not the batched GEMMs.
int64_t short_attention_launches();
// The same for the fused attention (kernels/cuda/fused_attention.cuh): one a forward, one
// a backward.
int64_t fused_attention_launches();
// The same for the decoding step's self-attention a warp a head (the former candidate
// decode_attention, kernels/cuda/decode_attention.cuh).
int64_t decode_attention_launches();
// The same for the register-held add & norm (kernels/cuda/vector_norm.cuh).
int64_t vector_norm_launches();
// The same for the one-pass Adam (kernels/cuda/fused_adam.cuh): one an update where its
// buffers are aligned for 16-byte moves.
int64_t fused_adam_launches();
// The same for the loss's row kernel in blocks of 512 (the former loss_rows_from_l2,
// kernels/cuda/cross_entropy.cu): one a vectorised softmax_cross_entropy(_add) call.
int64_t loss_rows_from_l2_launches();
// The same for the bias gradients that read the kept ones vector (the former kept_ones,
// kernels/cuda/linear.cu).
int64_t kept_ones_bias_gradients();
// The same for the weight gradients (a layer's dW and db, the output projection's dE)
// queued on a second stream beside their input gradient (candidate weight_grads_beside,
// kernels/cuda/linear.cu).
int64_t weight_grads_beside();
// The same for the FFN's products with the ReLU mask's epilogues (candidate relu_masks,
// kernels/cuda/linear.cu): one a first layer's forward, one a second layer's backward.
int64_t relu_mask_products();
// The same for the bias gradients summed in their weight gradient's product (candidate
// bias_grads_in_gemm, kernels/cuda/linear.cu).
int64_t bias_grads_in_gemm();
// transformer_bench_step --gemm-sweep (kernels/gemm_sweep.h): count the GPU's cuBLASLt
// products by shape from now on (nothing without CUDA), then time the heuristic's first
// max_algorithms offers for each shape counted; false without CUDA.
void count_gemm_uses();
bool sweep_gemm_algorithms(int max_algorithms, std::vector<GemmSweepRow>& rows);
// The fused attention's fragment probe on the current GPU (kernels/cuda/
// fused_attention.cuh, fragment_probe): false without CUDA.
bool fused_attention_fragment_probe(std::vector<uint32_t>& words,
                                    std::vector<uint32_t>& trans_words,
                                    std::vector<float>& products);

// Number of CUDA devices this process sees; 0 without CUDA.
int visible_cuda_devices();

// "NAME, PCI BUS_ID" of a CUDA device, or "cpu", for the start-up line of each rank.
std::string device_description(const Backend& backend, int device);

// What computes a run's arithmetic, as a checkpoint's stored configuration says
// (kComputedBy): "cpu-fp32, oneDNN 2.6.3, avx512_core_bf16, the smallest by OpenBLAS
// 0.3.21 SkylakeX kernels" (cpu::gemm_identity), or "cuda-bf16 on NVIDIA H100 80GB HBM3".
// No host or bus, and a thread count only where OpenBLAS computes the products (the CPU
// ops and oneDNN give the same bits on any number of threads, cpu_backend.h): the same
// kind of machine computes the same bits.
std::string compute_identity(const Backend& backend, int device);

// The backend a request names. backend = cuda without a usable device is an error
// naming the reason; auto falls back to the CPU.
std::unique_ptr<Backend> make_backend(const BackendRequest& request);

// The request a run's [train] section makes, on CUDA device `device` (the trainer picks
// one per rank).
BackendRequest backend_request(const TrainConfig& train, int device);

// The backend train.backend and train.precision name, on CUDA device 0: what the tools
// (decoding, benchmarks) use, without depending on the trainer.
std::unique_ptr<Backend> make_backend(const TrainConfig& train);

}  // namespace thpc
