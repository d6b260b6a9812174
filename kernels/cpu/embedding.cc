// Token embedding with positional encoding (§3.4, §3.5) on the CPU.
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {
namespace {

// A token id outside the table would read or write out of bounds: fail loudly instead.
void check_token(int32_t token, int vocab, int row) {
  THPC_CHECK(token >= 0 && token < vocab,
             "token id " << token << " at row " << row << " is outside the vocabulary [0, "
                         << vocab << ")");
}

}  // namespace

// out[r] = table[tokens[r]] * scale + positions[r % length]. The model passes
// scale = sqrt(d_model): §3.4 multiplies the shared embedding weights by sqrt(d_model).
// A null positions table adds nothing (an embedding without positional encoding).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, const T* positions,
                       int rows, int length, int d, int vocab, T scale) {
  THPC_CHECK(rows == 0 || length > 0, "embedding of " << rows << " rows with length " << length);
  for (int row = 0; row < rows; ++row) check_token(tokens[row], vocab, row);
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * d))
  for (int row = 0; row < rows; ++row) {
    const int32_t token = tokens[row];
    const T* token_vector = table + static_cast<int64_t>(token) * d;
    T* out_row = out + static_cast<int64_t>(row) * d;
    const int position = row % length;  // sentence b's position t is row b * length + t
    for (int col = 0; col < d; ++col) out_row[col] = token_vector[col] * scale;
    if (positions != nullptr) {
      const T* position_vector = positions + static_cast<int64_t>(position) * d;
      for (int col = 0; col < d; ++col) out_row[col] += position_vector[col];
    }
  }
}

// d_table[tokens[r]] += d_out[r] * scale; d_positions[r % length] += d_out[r].
// A token that appears several times accumulates one contribution per occurrence.
template <typename T>
void embedding_backward(T* d_table, T* d_positions, const T* d_out, const int32_t* tokens,
                        int rows, int length, int d, int vocab, T scale) {
  THPC_CHECK(rows == 0 || length > 0, "embedding of " << rows << " rows with length " << length);
  for (int row = 0; row < rows; ++row) {
    const T* d_out_row = d_out + static_cast<int64_t>(row) * d;
    if (d_table != nullptr) {
      const int32_t token = tokens[row];
      check_token(token, vocab, row);
      T* d_token_vector = d_table + static_cast<int64_t>(token) * d;
      for (int col = 0; col < d; ++col) d_token_vector[col] += d_out_row[col] * scale;
    }
    if (d_positions != nullptr) {
      T* d_position_vector = d_positions + static_cast<int64_t>(row % length) * d;
      for (int col = 0; col < d; ++col) d_position_vector[col] += d_out_row[col];
    }
  }
}

// §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
// Computed in double so the fp32 table is the correctly rounded value of the formula.
template <typename T>
void sinusoidal_positions(T* table, int max_len, int d) {
  for (int pos = 0; pos < max_len; ++pos) {
    for (int col = 0; col < d; ++col) {
      const int pair = col / 2;  // i: columns 2i and 2i+1 share one frequency
      const double angle =
          static_cast<double>(pos) / std::pow(10000.0, 2.0 * pair / static_cast<double>(d));
      const double value = (col % 2 == 0) ? std::sin(angle) : std::cos(angle);
      table[static_cast<int64_t>(pos) * d + col] = static_cast<T>(value);
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int,
                                       int, int, int, float);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*,
                                        int, int, int, int, double);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int, int,
                                        int, int, float);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, int,
                                         int, int, int, double);
template void sinusoidal_positions<float>(float*, int, int);
template void sinusoidal_positions<double>(double*, int, int);

}  // namespace thpc::cpu
