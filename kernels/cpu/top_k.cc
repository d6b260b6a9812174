// The best k entries of each row (Backend::row_top_k): the reference the CUDA op is
// checked against, and what the CPU backend runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {

namespace {

// The op's total order on (value, column): the larger number first, NaN after every
// number, among equals (NaN with NaN too) the smaller column first.
template <typename T>
bool ranks_before(T value_a, int column_a, T value_b, int column_b) {
  const bool nan_a = std::isnan(value_a), nan_b = std::isnan(value_b);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && value_a != value_b) return value_a > value_b;
  return column_a < column_b;
}

}  // namespace

// One pass over the row keeping the best k so far sorted: a column enters when it ranks
// before the worst kept (columns come in increasing order, so an equal value never
// does), at the place after every kept one that ranks before it. k is small (2 * beam)
// against the vocabulary, so the insertion's shifting is rare once the list is full.
//
// Once k are kept and the worst of them is a number w, a column can enter only if its
// value is > w (an equal one, a smaller one and NaN rank after it): the row is scanned
// kBlock columns at a time for any value > w, a comparison the compiler vectorises, and
// a block without one is passed over whole. The blocks that have one go through the
// column-by-column rule, so the choice is the same as without the scan. On a decoding
// row nearly every block is passed over (this op was 1.5% of a base-model beam search,
// a branch per column).
//
// Above kMostKeptInOrder the kept list's insertions shift up to k entries each, about
// k ln(width / k) times a row: at --beam 1000 (k = 2,000 of 8,000 columns) a decoding step
// took seconds. Such a row is selected instead (std::nth_element, then the best k sorted),
// O(width + k log k), by the same total order: the same k in the same order.
template <typename T>
void row_top_k(T* values, int32_t* columns, const T* x, int rows, int width, int k,
               int skip_a, int skip_b) {
  check_row_top_k(rows, width, k, skip_a, skip_b);
  constexpr int kBlock = 16;
  constexpr int kMostKeptInOrder = 32;
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * width))
  for (int row = 0; row < rows; ++row) {
    const T* entries = x + int64_t(row) * width;
    T* best_values = values + int64_t(row) * k;
    int32_t* best_columns = columns + int64_t(row) * k;
    if (k > kMostKeptInOrder) {
      thread_local std::vector<std::pair<T, int32_t>> selectable;
      selectable.clear();
      for (int column = 0; column < width; ++column) {
        if (column != skip_a && column != skip_b) selectable.emplace_back(entries[column], column);
      }
      const auto before = [](const std::pair<T, int32_t>& a, const std::pair<T, int32_t>& b) {
        return ranks_before(a.first, a.second, b.first, b.second);
      };
      std::nth_element(selectable.begin(), selectable.begin() + (k - 1), selectable.end(),
                       before);
      std::sort(selectable.begin(), selectable.begin() + k, before);
      for (int i = 0; i < k; ++i) {
        best_values[i] = selectable[i].first;
        best_columns[i] = selectable[i].second;
      }
      continue;
    }
    int kept = 0;
    const auto consider = [&](int column) {
      if (column == skip_a || column == skip_b) return;
      const T value = entries[column];
      if (kept == k) {
        if (!ranks_before(value, column, best_values[k - 1], best_columns[k - 1])) return;
        --kept;
      }
      int at = kept;
      while (at > 0 && ranks_before(value, column, best_values[at - 1], best_columns[at - 1])) {
        best_values[at] = best_values[at - 1];
        best_columns[at] = best_columns[at - 1];
        --at;
      }
      best_values[at] = value;
      best_columns[at] = column;
      ++kept;
    };
    int column = 0;
    while (column < width) {
      if (kept == k && !std::isnan(best_values[k - 1]) && column + kBlock <= width) {
        const T worst = best_values[k - 1];
        bool any_above = false;
        for (int j = 0; j < kBlock; ++j) any_above |= entries[column + j] > worst;
        if (!any_above) {
          column += kBlock;
          continue;
        }
        for (const int end = column + kBlock; column < end; ++column) consider(column);
        continue;
      }
      consider(column++);
    }
  }
}

THPC_CPU_TWIN(row_top_k)

}  // namespace thpc::cpu
