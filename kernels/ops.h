// The op interface: the contract every backend (kernels/cpu, kernels/cuda) fulfils.
//
// The model (src/model) is written once as a sequence of calls on a Backend. A backend
// owns its memory (host memory for the CPU, device memory for CUDA) and implements each
// op with the shapes, layouts and saved state documented here and in kernels/op_list.h,
// the list that declares every op once. The CPU backend is the specification; a CUDA op
// is correct when it matches its CPU twin.
//
// Conventions for every op:
// * Matrices are row-major. Activations are [rows, features] with rows = batch * length,
//   sentence b's position t at row b * length + t. Padding is on the right.
// * Forward ops overwrite their outputs.
// * Backward ops ACCUMULATE (+=) into parameter gradients (ParamOut), so the shared
//   embedding and gradient accumulation need no extra adds; the caller zeroes them before
//   a backward pass. Activation gradients (Out) are accumulated or written as the op's
//   GradStore argument says: kAdd where several branches add into one buffer (a
//   residual's input), kWrite for a buffer's first writer, which then needs no zeroing
//   pass. A null gradient output means "not needed".
// * A Tensor's dtype is the backend's: Backend::param_dtype() for parameters, their
//   gradients and optimizer state; Backend::compute_dtype() for activations and the
//   weights as the GEMMs read them. Per-row statistics (layer norm mean/rstd, losses)
//   are always in param_dtype. So on the bf16 GPU backend an op reads bf16 weights (the
//   model's compute copy, ParamStore::compute) and bf16 activations, writes bf16
//   activation gradients, and accumulates weight gradients (dW, db, dgamma, dbeta,
//   d_table) into fp32. On the CPU both dtypes are the same.
// * Token ids and lengths are int32 in the backend's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace thpc {

enum class DType { F32, F64, BF16 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// A view of backend memory: a pointer, its element type and its element count.
// Shapes are passed to ops as explicit sizes; numel lets a backend check them.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t numel = 0;

  explicit operator bool() const { return data != nullptr; }
  // The elements [offset, offset + count) of this tensor.
  Tensor slice(int64_t offset, int64_t count) const;
};

// What a training pass's ops read from backend memory when they run rather than take as
// arguments when they are queued: what changes from one step to the next while the pass's
// shapes and buffers stay. A pass queued once and replayed (a CUDA graph, Backend::capture)
// then draws each step's own masks and scales each step's own gradient. Written before each
// micro-batch (StepInputsBuffer::set), 16 bytes.
struct StepInputs {  // trivially copyable: backends copy its bytes
  uint32_t dropout_step = 0;    // DropoutKey::step of the pass's masks
  uint32_t dropout_stream = 0;  // DropoutKey::stream
  float grad_scale = 0.0f;      // softmax_cross_entropy_add's gradient scale: 1 / step tokens
  uint32_t unused = 0;
};
static_assert(sizeof(StepInputs) == 16 && std::is_trivially_copyable_v<StepInputs>,
              "StepInputs is written as raw bytes by every backend");

// Which dropout mask to draw. Masks come from Philox4x32-10 (common/philox.h) keyed by
// seed; the counter is (element / 4, site, step, stream), so every (step, site,
// element) has its own draw, the CPU and the GPU draw the same bits, and a resumed run
// draws what the uninterrupted one would have drawn.
struct DropoutKey {
  uint64_t seed = 0;
  uint32_t step = 0;    // optimizer step
  uint32_t stream = 0;  // distinguishes ranks and accumulation micro-batches
  uint32_t site = 0;    // distinguishes the dropout sites inside the model
  // Null, or a StepInputs in backend memory whose dropout_step and dropout_stream the op
  // draws with, as they are when it runs, in place of step and stream: a captured pass's
  // masks (the model sets it only when it captures; the fields then hold the same values).
  const StepInputs* inputs = nullptr;
};

// The key an op draws with on a backend whose memory the host reads (the CPU's): step
// and stream from `inputs` when it is set.
inline DropoutKey key_as_it_runs(DropoutKey key) {
  if (key.inputs != nullptr) {
    key.step = key.inputs->dropout_step;
    key.stream = key.inputs->dropout_stream;
    key.inputs = nullptr;
  }
  return key;
}

// The per-batch description of attention masking.
struct AttentionShape {
  int batch = 0;       // B
  int heads = 0;       // h
  int query_len = 0;   // Lq: rows per sentence of q
  int key_len = 0;     // Lk: rows per sentence of k and v
  int d_k = 0;         // per-head query/key width
  int d_v = 0;         // per-head value width
  bool causal = false; // query t may see keys 0..t only (decoder self-attention)
  // Valid (non-pad) key count per sentence, int32[B] in backend memory. Keys at
  // positions >= key_lengths[b] are masked out.
  const int32_t* key_lengths = nullptr;
  float dropout = 0.0f;  // attention dropout on the probabilities
  DropoutKey dropout_key;
  // Where each sentence's keys are, int32[B, Lk] in backend memory, or null: key j of
  // sentence b (and its value) is row key_rows[b * Lk + j] of k (v), read only for
  // j < key_lengths[b]; null, row b * Lk + j. Incremental decoding's shared-prefix cache
  // (model/decoder_state.h): hypotheses read their common prefix's rows where it was
  // written. Every backend's attention_forward takes it (backward does not: decoding
  // only), and with it reads no key or value row that is not listed.
  const int32_t* key_rows = nullptr;
};

// What a backward op does with its activation gradients (its Out parameters; parameter
// gradients are always accumulated):
//   kAdd    out += gradient: a buffer that other branches add into as well;
//   kWrite  out = gradient, whatever out held (NaN included): the buffer's first writer.
// The values are those of kAdd into a zeroed buffer (the CPU twins: the same bits). On the
// GPU kWrite saves the zeroing pass, and its GEMMs run with beta = 0, reading no C.
enum class GradStore { kAdd, kWrite };

// The CUDA kernel variants written since the last GPU run, not yet checked on one
// (docs/testing.md, "Kernels not yet run on a GPU"): bits of the set a backend may take,
// named by train.cuda_kernels. Each candidate gets a bit and a name here, and its twin
// tests say which one failed, so a GPU session can measure the others
// (bench/gpu_session.sh). Waiting: fused_attention (bf16 attention with d_k = 64 and
// lengths up to 128 on mma.sync fragments held in registers, kernels/cuda/
// fused_attention.cuh; issue 51's attention at 16.7 TFLOP/s): its twins, memcheck and
// racecheck passed on an H200 (2026-11-29, 2026-12-04), but it is slower than the
// kernels it would replace at every bucket length (the base step's attention 6.57 ->
// 12.29 ms, 19.4 against 5.1 at 12 pieces: bench/RESULTS.md); its second design (not yet
// run on a GPU: instantiated per count of 16-key steps, up to four pairs a block, dropout
// drawn out of line; docs/design-model.md) waits for its twins and its timing;
// step_graphs (a training pass or decoding step captured once per shape into a CUDA graph
// and replayed, Backend::capture; issue 51's small batch, 6.18 -> 5.59 ms and
// host gaps 6.0% -> 0.2% at 3,125 tokens on 2026-12-04): its twins passed, but a
// capture's cost against the replays a corpus gives it is unmeasured
// (transformer_data_stats counts those), and the trainer has not run it on a GPU; its
// decoding half is transformer_decode's default (CudaKernelChoice::capture_decoding_steps);
// relu_masks (the FFN's ReLU kept as cuBLASLt's bit-mask by its first layer's GEMM,
// RELU_AUX_BIAS, and applied by its second layer's input-gradient GEMM, DRELU, instead of
// relu_bias_backward's pass over [rows, d_ff]): its twins passed on 2026-12-04, but the
// epilogues' GEMMs cost more (~1.4 ms at 25,000 tokens) than the 1.23 ms pass they save;
// weight_grads_beside (a layer's weight and bias gradients' products on a second
// stream beside its input gradient's; kernels/cuda/linear.cu): its twins passed on
// 2026-12-04, and it cost 0.7 ms at 25,000 tokens (0.07 ms less at 3,125); and
// fuller_column_sums (not yet run on a GPU: the bias and layer-norm gradients' column
// sums of a small batch in chunks short enough to fill the device, and their finish a
// block of eight threads a column; kernels/cuda/column_sums.cuh; issue 51's one-rank
// step, whose ReLU backward took 42 us a call for ~10 us of bytes); and worker_graphs
// (not yet run on a GPU: transformer_decode's --gpu-workers N each capturing its decoding
// steps, concurrent captures on one device in relaxed mode; issue 53's host gaps, 8.3% of
// a batch with one captured worker on 2026-12-04: another worker's replays fill a
// worker's round trip to the host); and fused_norm_grads (not yet run on a GPU: the add &
// norm backward's register-held kernel sums the layer norm's dgamma and dbeta from the dy
// and residual it has loaded, each warp over several rows into its shared-memory columns,
// instead of a second kernel reading both again; kernels/cuda/vector_norm.cuh's
// backward_rows_summing; issue 51: ~1.5 GB a base step at 25,000 tokens, and 30 launches
// fewer at one rank's 3,125); and fast_loss_exp (not yet run on a GPU: the loss's
// vectorised rows take their exps as __expf, the hardware's exp2, instead of expf:
// kernels/cuda/cross_entropy.cu's row_exp; issue 51's loss, 1.49 ms of the base step,
// whose ~31 instructions a logit take as long to issue as its bytes take to move); and
// bias_grads_in_gemm (not yet run on a GPU: a layer's bias gradient summed by its weight
// gradient's GEMM as it reads dy, cuBLASLt's BGRADA epilogue, instead of a second GEMM of
// dy against a ones vector; kernels/cuda/linear.cu; issue 51's one-rank step, ~54 such
// n = 1 products a base step); and weight_decay (not yet run on a GPU: adamw_update,
// Adam's kernels with the decay folded into the update, p -= step + decay p,
// kernels/cuda/adam.cu; used only with train.weight_decay > 0, which the GPU refuses
// without it).
// The former ones are the default since their GPU run: write_gradients, short_attention
// (H100, 2026-11-26), gathered_attention (H100, 2026-11-27), async_upload, step_totals,
// int8_products, fused_adam (H200, 2026-11-29), vector_norms (the fused add & norm with
// each row in its warp's registers, kernels/cuda/vector_norm.cuh: 5.77 -> 3.77 ms of the
// base step), loss_rows_from_l2 (the loss's vectorised rows in blocks of 512, two an SM:
// 1.66 -> 1.49 ms), pinned_snapshot (a checkpoint's state copied into pinned host memory
// on the stream, the host not waiting: a base checkpoint's copy 0.09 -> 0.00 s), kept_ones
// (the bias gradient's ones vector filled once and kept) and decode_attention (a decoding
// step's self-attention a warp a head, kernels/cuda/decode_attention.cuh) (H200,
// 2026-12-04: their twins, and the kernels' memcheck, passed; Context::candidate_kernel no
// longer asks).
//
// Each candidate once, X(enumerator, bit, name in train.cuda_kernels): the enum, the set
// "candidate" names (kAllCandidates) and the names parse_candidate_kernels takes are made
// from this one list (a candidate added to the enum and left out of either was never
// enabled by "candidate", or not taken by its name, without a word; a helper's trial).
// A retired candidate's bit is not given again (checkpoints record the names, not bits).
#define THPC_CANDIDATE_KERNELS(X)                  \
  X(kFusedAttention, 3, "fused_attention")         \
  X(kStepGraphs, 4, "step_graphs")                 \
  X(kReluMasks, 7, "relu_masks")                   \
  X(kWeightGradsBeside, 11, "weight_grads_beside") \
  X(kFullerColumnSums, 12, "fuller_column_sums")   \
  X(kWorkerGraphs, 13, "worker_graphs")            \
  X(kFusedNormGrads, 14, "fused_norm_grads")       \
  X(kFastLossExp, 15, "fast_loss_exp")             \
  X(kBiasGradsInGemm, 16, "bias_grads_in_gemm")   \
  X(kWeightDecay, 17, "weight_decay")

enum CandidateKernels : unsigned {
  kNoCandidates = 0,
#define THPC_CANDIDATE_BIT(enumerator, bit, name) enumerator = 1u << (bit),
  THPC_CANDIDATE_KERNELS(THPC_CANDIDATE_BIT)
#undef THPC_CANDIDATE_BIT
#define THPC_CANDIDATE_IN_ALL(enumerator, bit, name) | enumerator
  kAllCandidates = 0u THPC_CANDIDATE_KERNELS(THPC_CANDIDATE_IN_ALL),
#undef THPC_CANDIDATE_IN_ALL
};

// The candidate set a train.cuda_kernels value names: "verified" (none), "candidate"
// (all), or candidate names joined by commas; the former candidates (the default since
// their GPU run, above) are accepted and name nothing. An unknown name: false, with
// `error` saying what is allowed.
bool parse_candidate_kernels(const std::string& setting, unsigned& candidates,
                             std::string& error);

// The longest sentence (query or key length) the short-sentence attention can take:
// its whole fp32 score matrix and the head's Q, K, V sit in one block's shared memory
// (kernels/cuda/short_attention.cuh, 163 KB at 128).
inline constexpr int kShortAttentionLongest = 128;

// Up to which length the short kernels are faster than the batched GEMMs, on the H100
// (bench/RESULTS.md, fourth GPU window, attention ms per base step by bucket length,
// batched -> short: 9.80 -> 7.70 at 48 pieces, 9.94 -> 10.28 at 64, 11.38 -> 19.52 at 96;
// big: 18.16 -> 14.95, 18.05 -> 21.19, 20.50 -> 39.25). Past ~48 a block's shared memory
// leaves an SM 2 or 3 blocks, and each block's 4 warps walk L^2 scores alone.
inline constexpr int kShortAttentionDefaultMaxLength = 48;

// What a capture into a CUDA graph holds (Backend::can_capture): a training pass
// (Transformer::train_step) or a decoding step (Transformer::decode_step, with the
// search's padding to few shapes, CachedTransformerScorer).
enum class CaptureUse { kTrainingPass, kDecodingStep };

// Which of its kernels the CUDA backend may choose ([train] cuda_kernels and
// short_attention_max_len); the CPU backend ignores it.
struct CudaKernelChoice {
  unsigned candidates = kNoCandidates;  // CandidateKernels bits
  // bf16 attention with d_k = d_v = 64 whose query and key lengths are both at most this
  // takes the short-sentence kernels; 0: never (the batched GEMMs alone).
  int short_attention_max_len = kShortAttentionDefaultMaxLength;
  // Decoding steps captured into CUDA graphs and replayed without the candidate
  // step_graphs (whose training passes wait for a GPU measurement of a capture's cost):
  // the decoding half ran on an H200 on 2026-12-04, its twins bit for bit and newstest2014
  // at batch 32 1.68x faster with all candidates (bench/RESULTS.md). transformer_decode
  // sets it for one GPU worker (--cuda-graphs on, its default), and for several with the
  // candidate worker_graphs (their concurrent captures have not run on a GPU); the
  // trainer's validation decoding has not run with it either: off there.
  // (make_decoding_backend takes step_graphs out of a decoder's candidates: this flag
  // alone decides there.)
  bool capture_decoding_steps = false;
};

// A training step's sums, kept in backend memory (on the GPU, device memory) by the ops
// softmax_cross_entropy_add and sum_squares_into, and read back once, at the step's end
// (StepTotalsBuffer::read), instead of after each micro-batch's loss and again for the norm:
// a read-back between forward and backward leaves the GPU idle while the host queues
// backward (issue 51). Held in a param_dtype tensor (StepTotalsBuffer) zeroed before a
// step; the ops see its bytes as this struct.
struct StepTotals {  // trivially copyable: backends copy its bytes
  double loss = 0.0;          // label-smoothed cross-entropy, summed over counted targets
  double nll = 0.0;           // negative log-likelihood, summed
  double grad_squares = 0.0;  // sum of the squared gradient (sum_squares_into: written)
  int64_t tokens = 0;         // counted (non-pad) targets
  int32_t bad_rows = 0;       // rows whose target lay outside the vocabulary (skipped)
  int32_t first_bad_row = 0;  // the first of them (row of its micro-batch) and its target
  int32_t first_bad_target = 0;
  int32_t unused = 0;
};
static_assert(sizeof(StepTotals) == 48 && std::is_trivially_copyable_v<StepTotals>,
              "StepTotals is read as raw bytes by every backend");

// Sums returned by softmax_cross_entropy (validation, tests): read back at once.
struct LossSums {
  double loss = 0.0;      // label-smoothed cross-entropy, summed over non-pad targets
  double nll = 0.0;       // plain negative log-likelihood, summed (for perplexity)
  int64_t tokens = 0;     // non-pad targets
};

// The DType of an element type: F32 for float, F64 for double (and BF16 for CUDA's
// __nv_bfloat16, specialised in kernels/cuda/cuda_ops.h). What a backend checks a
// Tensor's dtype against before handing its data to a twin as T*.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<double>() { return DType::F64; }

// Throws unless the sizes, head widths, row strides and attention dropout of `shape` are
// valid: the check both backends' attention ops make first.
void check_attention_shape(const AttentionShape& shape, int ldq, int ldk, int ldv);

// The columns of a row of `width` that skip_a and skip_b leave selectable.
int row_top_k_selectable(int width, int skip_a, int skip_b);
// Throws, naming the sizes, unless 1 <= k <= the selectable columns: what both
// backends' row_top_k twins require.
void check_row_top_k(int rows, int width, int k, int skip_a, int skip_b);
// The same for Backend::row_top_k's arguments, and that values and x hold [rows, k] and
// [rows, width]: checked before either backend's twin runs (kernels/twin_call.h).
void check_row_top_k(const Tensor& values, const int32_t* columns, const Tensor& x,
                     int rows, int width, int k, int skip_a, int skip_b);

// Timestamps taken in the order of a backend's work, for timing it op by op
// (kernels/profiling_backend.h) without waiting for it in between.
class WorkClock {
 public:
  virtual ~WorkClock() = default;
  // Notes the moment the backend's work queued so far is done; returns the mark's index
  // (0, 1, 2, ... since the last clear()).
  virtual int mark() = 0;
  // Seconds from mark `from` to mark `to`, waiting until both have been reached.
  virtual double seconds_between(int from, int to) = 0;
  // Seconds from an origin shared by every clock of this process on the same device to
  // mark `mark`, waiting until it has been reached: the marks of several backends sharing
  // a GPU (transformer_decode --gpu-workers, each on its own stream) on one time line, so
  // that the time none of them had work on the device can be told.
  virtual double seconds_since_origin(int mark) = 0;
  // Forgets every mark (read the ones you need first).
  virtual void clear() = 0;
};

// Work a backend queued once and can queue again as a whole (Backend::capture): a CUDA
// graph of a training pass, replayed at each step of its shape.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Queues the captured work again, every op with the arguments and the memory it had
  // when captured (so what changes between replays lives in memory: StepInputs, the
  // batch's ids uploaded to the same place); false, queuing nothing, when memory has been
  // freed since the capture, as its pointers may be stale: capture it again.
  virtual bool replay() = 0;
};

// Host memory a backend's fp32 tensors are copied into without the host waiting for the
// copies (Backend::make_host_staging), read later, perhaps by another thread: a
// checkpoint's snapshot, which training waited for whole (issue 51: a 757 MB base
// snapshot held the H200's steps 0.96 s; most of it the host faulting in fresh pages and
// copying from pageable memory). Made once and reused, so that its pages are the
// process's already.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  // The capacity, in floats.
  virtual int64_t floats() const = 0;
  // Queues the copy of the fp32 tensor `src` into floats [offset, offset + src.numel):
  // after the backend's work queued so far, before the work queued after (so it holds
  // `src` as that work left it). May return before the copy has landed.
  virtual void queue_download(int64_t offset, Tensor src) = 0;
  // Waits until every copy queued so far has landed, then returns the floats. Callable
  // from any thread; no copy may be queued until the caller is done reading.
  virtual const float* wait() = 0;

 protected:
  // Throws unless `src` is fp32 and fits at `offset`: what every queue_download checks.
  void check_copy(int64_t offset, const Tensor& src) const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when tensors live in host memory (the CPU backend): host-side collectives such
  // as MPI_Allreduce may then work on them directly.
  virtual bool host_memory() const = 0;
  virtual DType param_dtype() const = 0;
  virtual DType compute_dtype() const = 0;

  // ---- memory -------------------------------------------------------------------
  virtual Tensor alloc(DType dtype, int64_t numel) = 0;  // contents unspecified
  virtual void free(Tensor& tensor) = 0;
  virtual int32_t* alloc_ids(int64_t count) = 0;
  virtual void free_ids(int32_t*& ids) = 0;
  virtual void zero(Tensor tensor) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;  // same numel; converts dtypes
  // Host <-> backend transfers; host data is in the tensor's dtype.
  virtual void upload(Tensor dst, const void* host) = 0;
  virtual void download(void* host, Tensor src) = 0;
  virtual void upload_ids(int32_t* dst, const int32_t* host, int64_t count) = 0;
  virtual void download_ids(int32_t* host, const int32_t* src, int64_t count) = 0;
  virtual void synchronize() = 0;
  // The cudaStream_t every op is queued on (CUDA backend; null on the CPU), so that the
  // gradient all-reduce can order its own stream after the ops that wrote a bucket.
  virtual void* native_stream() const { return nullptr; }
  // The CUDA device index of a GPU backend; -1 on the CPU.
  virtual int device() const { return -1; }
  // Lets the calling thread queue this backend's work when another thread made it (a
  // GPU backend: makes its device the thread's current one, which the CUDA runtime keeps
  // per thread; a new thread starts on device 0). Nothing on the CPU.
  virtual void use_on_this_thread() {}
  // The most memory this backend's work has held at once, in bytes, or -1 where it
  // cannot tell. The CPU backend: the process's peak resident set (VmHWM), since its
  // tensors live in host memory among the rest of the process. A GPU backend: the peak
  // of the device bytes it has allocated through cudaMalloc (tensors, arenas, its
  // cuBLASLt workspace and scratch), counted on the host at each allocation and free;
  // not the CUDA context's, cuBLAS's or NCCL's own.
  virtual int64_t peak_memory_bytes() const = 0;
  // A clock for timing this backend's work. Here the host's steady clock, which is right
  // for a synchronous backend (the CPU's: an op's work is done when its call returns); a
  // GPU backend records events on its stream instead.
  virtual std::unique_ptr<WorkClock> make_work_clock();
  // Host memory of `floats` floats that this backend's fp32 tensors can be copied into
  // beside its work (HostStaging). Here synchronous: each queue_download is download()
  // into a host buffer, so the copy is done when it returns; the CUDA backend copies
  // into pinned memory on its stream, without a wait.
  virtual std::unique_ptr<HostStaging> make_host_staging(int64_t floats);

  // ---- what the attention ops save and read ----------------------------------------
  // The element count of attention_forward's `saved` (the probabilities
  // [B, h, Lq, Lk]): the same on every backend, as the layout is the contract's.
  static int64_t attention_saved_numel(const AttentionShape& shape);
  // What encoding a source batch in one more part costs here, in rows: Transformer::
  // encode runs a batch of mixed lengths in groups of similar length, each padded to its
  // own longest, when that computes fewer rows in all, this cost per group included.
  // 0: always in one part (CUDA's, until measured on a GPU: a group costs its launches
  // there, and transformer_decode's length-sorted GPU batches are nearly uniform).
  virtual int encoder_group_cost_rows() const { return 0; }

  // ---- the fused ops -------------------------------------------------------------
  // Whether the model takes the fused ops (add_dropout_layernorm_*, linear_relu_forward,
  // relu_bias_backward) in place of the separate ones when model.fused_ops = auto: true
  // only on a backend where they have passed their twin tests and give what the
  // separate ops give (the CPU's, bit for bit: AddNorm.*, LinearRelu.*, ReluBiasBackward.*).
  virtual bool fused_ops_by_default() const { return false; }
  // How many 32-bit words of ReLU bit-mask the FFN's first layer of `rows` x `n` keeps for
  // its backward (linear_relu_mask_forward, linear_relu_backward), in this backend's
  // layout; 0 where the backend reads the layer's output instead (the CPU; a GPU without
  // the candidate relu_masks), and the model then keeps no mask.
  virtual int64_t relu_mask_words(int /*rows*/, int /*n*/) const { return 0; }

  // ---- captured work (CUDA graphs) -------------------------------------------------
  // Whether capture() captures work of this `use` on this backend: on a GPU a training
  // pass with train.cuda_kernels step_graphs (a candidate), a decoding step with it or
  // with CudaKernelChoice::capture_decoding_steps (transformer_decode's --cuda-graphs,
  // on with one GPU worker); the CPU's stand-in for tests (kernels/capturing_backend.h)
  // captures both.
  virtual bool can_capture(CaptureUse /*use*/) const { return false; }
  // Calls `queue_work`, capturing what it queues instead of running it, and returns the
  // work, not yet run (replay() runs it). The work may allocate but must not wait for the
  // backend, move data from or to the host, or free memory: then, or where this backend
  // cannot capture, null, and nothing queued by it has run or will: queue it again
  // uncaptured. A warm-up run of the same work first lets the arenas and scratch buffers
  // reach their size, so that the capture allocates nothing. It captures whatever it is
  // given where the backend captures any use: the caller asks can_capture(use) first.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& queue_work);

  // ---- the ops ------------------------------------------------------------------
  // The roles of an op's tensor parameters (kernels/op_list.h): all are Tensors here.
  // In/Out hold compute_dtype(), ParamIn/ParamOut param_dtype(); the ...Out ones are
  // written or accumulated into.
  using In = Tensor;
  using Out = Tensor;
  using ParamIn = Tensor;
  using ParamOut = Tensor;
  // One pure virtual function per entry of kernels/op_list.h, where each op's shapes,
  // layouts and accumulation are documented.
#define THPC_OP(ret, name, params, args) virtual ret name params = 0;
#include "kernels/op_list.h"
#undef THPC_OP
};

// Names the ops of kernels/op_list.h, for code that handles every op alike: the backends'
// argument checks (kernels/twin_call.h), and timing per op.
enum class OpId {
#define THPC_OP(ret, name, params, args) name,
#include "kernels/op_list.h"
#undef THPC_OP
};
// "linear_forward" for OpId::linear_forward.
const char* op_name(OpId op);

// One StepTotals in a backend's memory (a param_dtype tensor of 48 bytes), for
// softmax_cross_entropy_add and sum_squares_into; freed with this object.
class StepTotalsBuffer {
 public:
  explicit StepTotalsBuffer(Backend& backend);  // zeroed
  ~StepTotalsBuffer();
  StepTotalsBuffer(const StepTotalsBuffer&) = delete;
  StepTotalsBuffer& operator=(const StepTotalsBuffer&) = delete;

  Tensor tensor() const { return tensor_; }
  void zero() { backend_.zero(tensor_); }  // queued, before a step
  // The totals, read back to the host: the step's one wait for the backend. A step whose
  // targets fell outside [0, vocab) (StepTotals::bad_rows) throws here, naming the first
  // such target and row, as softmax_cross_entropy does at once.
  StepTotals read(int vocab);

 private:
  Backend& backend_;
  Tensor tensor_;
};

// One StepInputs in a backend's memory (a param_dtype tensor of 16 bytes), written before
// each micro-batch; freed with this object.
class StepInputsBuffer {
 public:
  explicit StepInputsBuffer(Backend& backend);  // zeroed
  ~StepInputsBuffer();
  StepInputsBuffer(const StepInputsBuffer&) = delete;
  StepInputsBuffer& operator=(const StepInputsBuffer&) = delete;

  // Queues the write of `inputs` (write_step_inputs: after the work queued so far, before
  // what follows).
  void set(const StepInputs& inputs);
  // The inputs in backend memory, for DropoutKey::inputs and softmax_cross_entropy_add.
  const StepInputs* in_backend() const { return static_cast<const StepInputs*>(tensor_.data); }

 private:
  Backend& backend_;
  Tensor tensor_;
};

}  // namespace thpc

// Strips one pair of parentheses: THPC_UNPAREN (a, b) is `a, b`. An entry of
// kernels/op_list.h gives its parameters and its arguments in parentheses.
#define THPC_UNPAREN(...) __VA_ARGS__
