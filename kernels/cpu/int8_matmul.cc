#include "kernels/cpu/int8_matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "common/error.h"
#include "kernels/cpu/onednn_library.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_clones.h"

#if THPC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace thpc::cpu {

namespace {

// x rounded to the nearest integer, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves
// no fraction bits, so the sum is rounded there (the default rounding mode: to nearest,
// ties to even) and the subtraction is exact. std::nearbyint's result, in two additions
// the compiler vectorises, where nearbyint stays a call per element (it was a tenth of an
// int8 decode).
[[gnu::always_inline]] inline float round_to_integer(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (x + kShift) - kShift;
}

// value * inverse (inverse = limit / the largest |value|) rounded and held to
// [-limit, limit]: the product is at most limit but for its rounding. The one
// quantization of activations and weights alike.
[[gnu::always_inline]] inline float quantize_value(float value, float inverse, float limit) {
  const float q = round_to_integer(value * inverse);
  return q < -limit ? -limit : (q > limit ? limit : q);
}

// max_k |x[k]|, in 16 independent lanes the compiler vectorises (a single running
// maximum is a reduction it will not reorder); NaN when x holds a NaN or an infinity
// (the lanes' x * 0 sums are NaN then), which the comparisons alone would pass over.
// Always inlined, so that quantize_row's AVX2 and AVX-512 clones vectorise it too.
[[gnu::always_inline]] inline float largest_magnitude(const float* x, int count) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {}, non_finite[kLanes] = {};
  int k = 0;
  for (; k + kLanes <= count; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float magnitude = std::fabs(x[k + j]);
      lanes[j] = magnitude > lanes[j] ? magnitude : lanes[j];
      non_finite[j] += x[k + j] * 0.0f;
    }
  }
  float largest = 0.0f, poison = 0.0f;
  for (; k < count; ++k) {
    largest = std::max(largest, std::fabs(x[k]));
    poison += x[k] * 0.0f;
  }
  for (int j = 0; j < kLanes; ++j) {
    largest = std::max(largest, lanes[j]);
    poison += non_finite[j];
  }
  return largest + poison;
}

}  // namespace

THPC_VECTOR_CLONES
float quantize_row(const float* x, int count, uint8_t* xq) {
  const float largest = largest_magnitude(x, count);
  if (!std::isfinite(largest)) {
    // A NaN or infinite activation (a diverged model): the row's products are NaN, as
    // the float product's would be, through its scale; the values are the zero point.
    std::fill(xq, xq + count, uint8_t{128});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  for (int k = 0; k < count; ++k) {
    // In [-127, 127]: + 128 is [1, 255].
    xq[k] = static_cast<uint8_t>(static_cast<int>(quantize_value(x[k], inverse, 127.0f)) + 128);
  }
  return largest / 127.0f;
}

QuantizedWeights quantize_weights(const float* weights, int inputs, int outputs,
                                  WeightLayout layout, int limit) {
  THPC_CHECK(inputs > 0 && outputs > 0 && limit > 0 && limit <= 127,
             "int8 weights of " << inputs << " x " << outputs << " within +-" << limit);
  const auto at = [&](int k, int n) {
    return layout == WeightLayout::kInputsByOutputs
               ? weights[static_cast<int64_t>(k) * outputs + n]
               : weights[static_cast<int64_t>(n) * inputs + k];
  };
  // Scales first (the largest |W| of each output), then the values, each in the order
  // the float weights lie in memory.
  std::vector<float> largest(outputs, 0.0f);
  for (int k = 0; k < inputs; ++k) {
    for (int n = 0; n < outputs; ++n) largest[n] = std::max(largest[n], std::fabs(at(k, n)));
  }
  QuantizedWeights quantized;
  quantized.inputs = inputs;
  quantized.outputs = outputs;
  quantized.scales.resize(outputs);
  std::vector<float> inverse(outputs);
  for (int n = 0; n < outputs; ++n) {
    quantized.scales[n] = largest[n] / static_cast<float>(limit);
    inverse[n] = largest[n] > 0.0f ? static_cast<float>(limit) / largest[n] : 0.0f;
  }
  quantized.values.resize(static_cast<size_t>(inputs) * outputs);
  for (int k = 0; k < inputs; ++k) {
    for (int n = 0; n < outputs; ++n) {
      quantized.values[static_cast<int64_t>(k) * outputs + n] = static_cast<int8_t>(
          quantize_value(at(k, n), inverse[n], static_cast<float>(limit)));
    }
  }
  return quantized;
}

#if THPC_HAVE_ONEDNN

namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A matmul's primitive descriptor: oneDNN 3 takes the engine and the memory descriptors
// directly, oneDNN 2 an operation descriptor first (Debian 12 has 2.6; Spack builds 3.x).
dnnl::matmul::primitive_desc matmul_desc(const memory::desc& source, const memory::desc& weights,
                                         const memory::desc& destination) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(cpu_engine(), source, weights, destination);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(source, weights, destination),
                                      cpu_engine());
#endif
}

memory::desc plain_desc(int rows, int columns, memory::data_type type) {
  return memory::desc({rows, columns}, type, memory::format_tag::ab);
}

// Whether oneDNN's int8 kernel on this machine adds u8 x s8 products into int32 without
// saturating: asked of the kernel itself, with the one product that tells. A row of 255s
// times a column of 127s is 64 x 32,385 = 2,072,640 exactly; a kernel that adds the
// products in pairs into a saturating int16 first (AVX2's and plain AVX-512's
// vpmaddubsw: 2 x 32,385 > 32,767) gets 32 x 32,767 instead. VNNI (vpdpbusd) and AMX
// multiply straight into int32. Probing, rather than naming the instruction sets, also
// follows DNNL_MAX_CPU_ISA and CPUs newer than this code.
bool products_reach_int32_exactly() {
  constexpr int kDepth = 64, kColumns = 16;
  std::vector<uint8_t> row(kDepth, 255);
  std::vector<int8_t> column(static_cast<size_t>(kDepth) * kColumns, 127);
  std::vector<int32_t> product(kColumns, 0);
  dnnl::stream stream(cpu_engine());
  const auto pd = matmul_desc(plain_desc(1, kDepth, memory::data_type::u8),
                              plain_desc(kDepth, kColumns, memory::data_type::s8),
                              plain_desc(1, kColumns, memory::data_type::s32));
  memory source(pd.src_desc(), cpu_engine(), row.data());
  memory weights(pd.weights_desc(), cpu_engine(), column.data());
  memory destination(pd.dst_desc(), cpu_engine(), product.data());
  dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, source},
                                    {DNNL_ARG_WEIGHTS, weights},
                                    {DNNL_ARG_DST, destination}});
  stream.wait();
  return product[0] == kDepth * 255 * 127;
}

// Rows per product: the int32 products of a chunk are dequantized while in the cache,
// and the scratch stays bounded (512 x 37,000 logits: 76 MB).
constexpr int kRowsPerChunk = 512;

}  // namespace

bool int8_available() { return true; }

int int8_weight_limit() {
  static const int limit = products_reach_int32_exactly() ? 127 : 63;
  return limit;
}

std::string int8_description() {
  std::ostringstream text;
  text << onednn_version_and_isa() << ", " << (int8_weight_limit() == 127 ? 8 : 7)
       << "-bit weights";
  return text.str();
}

struct QuantizedMatrix::Kernel {
  memory::desc weights_desc;  // the layout the weights were reordered into
  memory weights;
  dnnl::stream stream{cpu_engine()};
  std::map<int, dnnl::matmul> by_rows;  // one primitive per row count

  dnnl::matmul& primitive(int rows, int inputs, int outputs) {
    auto found = by_rows.find(rows);
    if (found != by_rows.end()) return found->second;
    const auto pd = matmul_desc(plain_desc(rows, inputs, memory::data_type::u8), weights_desc,
                                plain_desc(rows, outputs, memory::data_type::s32));
    return by_rows.emplace(rows, dnnl::matmul(pd)).first->second;
  }
};

QuantizedMatrix::QuantizedMatrix(const float* weights, int inputs, int outputs,
                                 WeightLayout layout)
    : QuantizedMatrix(quantize_weights(weights, inputs, outputs, layout, int8_weight_limit())) {}

QuantizedMatrix::QuantizedMatrix(const QuantizedWeights& weights)
    : inputs_(weights.inputs),
      outputs_(weights.outputs),
      scales_(weights.scales),
      kernel_(std::make_unique<Kernel>()) {
  const int inputs = inputs_, outputs = outputs_;
  THPC_CHECK(inputs > 0 && outputs > 0, "an int8 matrix of " << inputs << " x " << outputs);
  THPC_CHECK(weights.values.size() == static_cast<size_t>(inputs) * outputs &&
                 weights.scales.size() == static_cast<size_t>(outputs),
             "int8 weights of " << weights.values.size() << " values and "
                                << weights.scales.size() << " scales for " << inputs << " x "
                                << outputs);
  const int limit = int8_weight_limit();
  const std::vector<int8_t>& plain = weights.values;  // the reorder's source
  column_sums_.assign(outputs, 0);
  for (int k = 0; k < inputs; ++k) {
    for (int n = 0; n < outputs; ++n) {
      const int q = plain[static_cast<int64_t>(k) * outputs + n];
      THPC_CHECK(q >= -limit && q <= limit,
                 "an int8 weight of " << q << ": this CPU's int8 products take weights within +-"
                                      << limit);
      column_sums_[n] += q;
    }
  }
  // The layout oneDNN's kernels want for these weights, as chosen for a decoder step's
  // row count; every other row count takes the same layout (checked here for a few:
  // where one were refused, the plain layout, which every implementation reads).
  Kernel& k = *kernel_;
  k.weights_desc = matmul_desc(plain_desc(64, inputs, memory::data_type::u8),
                               memory::desc({inputs, outputs}, memory::data_type::s8,
                                            memory::format_tag::any),
                               plain_desc(64, outputs, memory::data_type::s32))
                       .weights_desc();
  try {
    for (const int rows : {1, 7, 512}) k.primitive(rows, inputs, outputs);
  } catch (const dnnl::error&) {
    k.by_rows.clear();
    k.weights_desc = memory::desc({inputs, outputs}, memory::data_type::s8, memory::format_tag::ab);
  }
  memory source({{inputs, outputs}, memory::data_type::s8, memory::format_tag::ab}, cpu_engine(),
                const_cast<int8_t*>(plain.data()));
  k.weights = memory(k.weights_desc, cpu_engine());
  dnnl::reorder(source, k.weights).execute(k.stream, source, k.weights);
  k.stream.wait();
}

QuantizedMatrix::~QuantizedMatrix() = default;

std::vector<int8_t> QuantizedMatrix::quantized_values() const {
  std::vector<int8_t> plain(static_cast<size_t>(inputs_) * outputs_);
  memory target({{inputs_, outputs_}, memory::data_type::s8, memory::format_tag::ab},
                cpu_engine(), plain.data());
  dnnl::reorder(kernel_->weights, target).execute(kernel_->stream, kernel_->weights, target);
  kernel_->stream.wait();
  return plain;
}

namespace {

// One row of products dequantized (dequantize()), with or without the bias, then the
// ReLU's max(0, .): +0 for a negative, -0 or NaN sum, as relu_forward gives. One loop per
// case, each vectorised, in vector clones (vector_clones.h) as quantize_row is: compiled
// for SSE2 alone the two were a quarter of the time of the integer products they feed.
THPC_VECTOR_CLONES
void dequantize_row(float* out, const int32_t* acc, const int32_t* column_sums, float row_scale,
                    const float* column_scales, const float* b, int N, bool relu) {
  if (b != nullptr) {
    for (int n = 0; n < N; ++n) {
      out[n] = dequantize(acc[n], column_sums[n], row_scale, column_scales[n], b[n]);
    }
  } else {
    for (int n = 0; n < N; ++n) {
      out[n] = dequantize(acc[n], column_sums[n], row_scale, column_scales[n], 0.0f);
    }
  }
  if (relu) {
    for (int n = 0; n < N; ++n) out[n] = out[n] > 0.0f ? out[n] : 0.0f;
  }
}

// A thread's scratch for the products of every matrix it multiplies: grown to the
// largest chunk once and reused (one buffer per matrix cost a base model's 67 matrices
// some 300 MB of pages, each faulted in as it was first written).
struct Scratch {
  std::vector<uint8_t> rows_q;  // xq of a chunk
  std::vector<float> row_scales;
  std::vector<int32_t> products;
};
Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

void QuantizedMatrix::multiply(float* y, const float* x, const float* b, int rows,
                               bool relu) const {
  Kernel& k = *kernel_;
  Scratch& scratch = thread_scratch();
  const int K = inputs_, N = outputs_;
  for (int first = 0; first < rows; first += kRowsPerChunk) {
    const int count = std::min(kRowsPerChunk, rows - first);
    if (scratch.rows_q.size() < static_cast<size_t>(count) * K) scratch.rows_q.resize(static_cast<size_t>(count) * K);
    if (scratch.row_scales.size() < static_cast<size_t>(count)) scratch.row_scales.resize(count);
    if (scratch.products.size() < static_cast<size_t>(count) * N) scratch.products.resize(static_cast<size_t>(count) * N);
    const float* x_chunk = x + static_cast<int64_t>(first) * K;
    float* y_chunk = y + static_cast<int64_t>(first) * N;
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(count) * K))
    for (int m = 0; m < count; ++m) {
      scratch.row_scales[m] = quantize_row(x_chunk + static_cast<int64_t>(m) * K, K,
                                           scratch.rows_q.data() + static_cast<int64_t>(m) * K);
    }
    memory source(plain_desc(count, K, memory::data_type::u8), cpu_engine(),
                  scratch.rows_q.data());
    memory products(plain_desc(count, N, memory::data_type::s32), cpu_engine(),
                    scratch.products.data());
    k.primitive(count, K, N).execute(
        k.stream,
        {{DNNL_ARG_SRC, source}, {DNNL_ARG_WEIGHTS, k.weights}, {DNNL_ARG_DST, products}});
    k.stream.wait();
    const int32_t* column_sums = column_sums_.data();
    const float* column_scales = scales_.data();
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(count) * N))
    for (int m = 0; m < count; ++m) {
      dequantize_row(y_chunk + static_cast<int64_t>(m) * N,
                     scratch.products.data() + static_cast<int64_t>(m) * N, column_sums,
                     scratch.row_scales[m], column_scales, b, N, relu);
    }
  }
}

#else  // without oneDNN: the functions say so

bool int8_available() { return false; }
int int8_weight_limit() { return 127; }
std::string int8_description() {
  return "none: built without oneDNN (Debian: apt install libdnnl-dev; Spack: onednn), "
         "then configure again";
}

struct QuantizedMatrix::Kernel {};

QuantizedMatrix::QuantizedMatrix(const float*, int inputs, int outputs, WeightLayout)
    : inputs_(inputs), outputs_(outputs) {
  THPC_FAIL("int8 products need oneDNN, and this build has none: " << int8_description());
}
QuantizedMatrix::QuantizedMatrix(const QuantizedWeights& weights)
    : inputs_(weights.inputs), outputs_(weights.outputs) {
  THPC_FAIL("int8 products need oneDNN, and this build has none: " << int8_description());
}
QuantizedMatrix::~QuantizedMatrix() = default;
std::vector<int8_t> QuantizedMatrix::quantized_values() const { return {}; }
void QuantizedMatrix::multiply(float*, const float*, const float*, int, bool) const {}

#endif

}  // namespace thpc::cpu
