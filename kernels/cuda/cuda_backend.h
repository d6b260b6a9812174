// The CUDA backend: the ops of kernels/cuda behind the Backend interface, on one GPU.
//
// Parameters, their gradients and the Adam moments are fp32 (param_dtype); activations
// and the weights as the GEMMs read them are bf16 (precision "bf16", what training uses)
// or fp32 (precision "fp32", for checking against the CPU backend). Every op is queued
// on the backend's one stream; download(), sums and synchronize() wait for it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gemm_sweep.h"
#include "kernels/ops.h"

namespace thpc {

// device: a CUDA device index of this process (after CUDA_VISIBLE_DEVICES);
// compute_dtype: DType::BF16 or DType::F32; kernels: which of its kernels it may take
// (train.cuda_kernels and train.short_attention_max_len, cuda::Context).
std::unique_ptr<Backend> make_cuda_backend(int device, DType compute_dtype,
                                           const CudaKernelChoice& kernels = {});

// Launches of the short-sentence attention kernels (kernels/cuda/short_attention.cuh)
// in this process, forward and backward.
int64_t cuda_short_attention_launches();

// Launches of the fused attention (kernels/cuda/fused_attention.cuh, candidate
// fused_attention) in this process: one a forward, one a backward.
int64_t cuda_fused_attention_launches();

// Launches of the decoding step's self-attention a warp a head (kernels/cuda/
// decode_attention.cuh, the former decode_attention) in this process: one an attention
// over gathered keys that fits it.
int64_t cuda_decode_attention_launches();

// Launches of the register-held residual + dropout + layer norm kernels (kernels/cuda/
// vector_norm.cuh, the former vector_norms) in this process: one a forward, one a backward.
int64_t cuda_vector_norm_launches();

// Launches of the one-pass Adam (kernels/cuda/fused_adam.cuh) in this process: one an
// update whose buffers are aligned for it.
int64_t cuda_fused_adam_launches();

// Launches of the loss's row kernel in blocks of 512 (the former loss_rows_from_l2,
// cross_entropy.cu) in this process: one a softmax_cross_entropy(_add) call.
int64_t cuda_loss_rows_from_l2_launches();

// Bias gradients (linear_backward's db) that read the kept ones vector (candidate
// kept_ones, linear.cu) in this process.
int64_t cuda_kept_ones_bias_gradients();

// Weight gradients (a layer's dW and db, the output projection's dE) queued on the side
// stream beside their input gradient (candidate weight_grads_beside, linear.cu) in this
// process.
int64_t cuda_weight_grads_beside();

// GEMMs that ran with the ReLU mask's epilogues (candidate relu_masks, linear.cu) in this
// process: one a linear_relu_mask_forward, one a linear_relu_backward's input gradient.
int64_t cuda_relu_mask_products();

// Bias gradients summed by their weight gradient's product, cuBLASLt's BGRADA epilogue
// (candidate bias_grads_in_gemm, linear.cu) in this process.
int64_t cuda_bias_grads_in_gemm();

// From now on, count each cuBLASLt product linear.cu runs, by shape (from zero).
void cuda_count_gemm_uses();
// For each product counted since cuda_count_gemm_uses(), on the current device: the
// heuristic's first max_algorithms offers for its shape (its operands' alignments, epilogue
// and types) timed on random operands, and checked against the first (kernels/gemm_sweep.h).
std::vector<GemmSweepRow> cuda_sweep_gemm_algorithms(int max_algorithms);

// The fused attention's fragment probe (fused_attention::fragment_probe) run by one warp
// on device 0 of this process: its ldmatrix words, ldmatrix.trans words and products.
void cuda_fused_attention_fragment_probe(std::vector<uint32_t>& words,
                                         std::vector<uint32_t>& trans_words,
                                         std::vector<float>& products);

}  // namespace thpc
