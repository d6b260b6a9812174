// Token embedding with positional encoding (§3.4, §3.5) on the CPU; the sinusoidal table
// itself is kernels/positions.cc.
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
                       int rows, int length, int d, int vocab, float scale) {
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
                        int rows, int length, int d, int vocab, float scale) {
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

THPC_CPU_TWIN(embedding_forward)
THPC_CPU_TWIN(embedding_backward)

}  // namespace thpc::cpu
