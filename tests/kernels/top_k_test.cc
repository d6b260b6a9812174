// The best k entries of each row (Backend::row_top_k; kernels/cpu/top_k.cc, and the CUDA
// backend's): the CPU reference against a full sort of every row by the op's order,
// then the CUDA twin, which must choose the same columns and values exactly (selection
// does no arithmetic: bf16 rows widen to fp32 exactly, so there is no tolerance to choose).
//
// Rows hold many ties (values on a coarse grid), infinities and NaN, so the order's
// tie-break (smaller column first) and NaN rule (after every number) are exercised, not
// only the ranking of distinct values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_twin.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc::test {
namespace {

// Values on a grid of 0.25 in [-3, 3] (ties everywhere, never zero), with a few -inf,
// +inf and NaN entries when `specials`.
template <typename T>
std::vector<T> tie_heavy_rows(size_t count, std::mt19937& rng, bool specials) {
  std::uniform_int_distribution<int> grid(1, 24);
  std::uniform_int_distribution<int> special(0, 40);
  std::vector<T> values(count);
  for (T& value : values) {
    const int step = grid(rng);
    value = static_cast<T>((step <= 12 ? -step : step - 12) * 0.25);
    if (!specials) continue;
    switch (special(rng)) {
      case 0: value = -std::numeric_limits<T>::infinity(); break;
      case 1: value = std::numeric_limits<T>::infinity(); break;
      case 2: value = std::numeric_limits<T>::quiet_NaN(); break;
      default: break;
    }
  }
  return values;
}

// The specification, written independently of the op's one-pass insertion: order every
// selectable column of the row by (number before NaN, larger value, smaller column) and
// take the first k. std::partial_sort orders only those k (the order is total, ties
// broken by column, so they are a full sort's first k): a full sort of 400 rows of 37,000
// made RowTopK.ThroughTheBackendOnAModelsVocabulary a 30-second test in the sanitized
// build, whose test code is compiled at -O0.
template <typename T>
void sorted_top_k(std::vector<T>& values, std::vector<int32_t>& columns,
                  const std::vector<T>& x, int rows, int width, int k, int skip_a, int skip_b) {
  values.assign(static_cast<size_t>(rows) * k, T(0));
  columns.assign(static_cast<size_t>(rows) * k, -1);
  for (int r = 0; r < rows; ++r) {
    const T* row = x.data() + static_cast<size_t>(r) * width;
    std::vector<int> order;
    for (int c = 0; c < width; ++c) {
      if (c != skip_a && c != skip_b) order.push_back(c);
    }
    const auto kth =
        order.begin() + std::min<std::ptrdiff_t>(k, static_cast<std::ptrdiff_t>(order.size()));
    std::partial_sort(order.begin(), kth, order.end(), [&](int a, int b) {
      if (std::isnan(row[a]) != std::isnan(row[b])) return std::isnan(row[b]);
      if (!std::isnan(row[a]) && row[a] != row[b]) return row[a] > row[b];
      return a < b;
    });
    for (int i = 0; i < k; ++i) {
      values[static_cast<size_t>(r) * k + i] = row[order[static_cast<size_t>(i)]];
      columns[static_cast<size_t>(r) * k + i] = order[static_cast<size_t>(i)];
    }
  }
}

// Equal as the op promises: the same columns, and the same values bit for bit (NaN
// where NaN was chosen).
template <typename T>
::testing::AssertionResult same_choice(const std::vector<T>& values,
                                       const std::vector<int32_t>& columns,
                                       const std::vector<T>& want_values,
                                       const std::vector<int32_t>& want_columns) {
  for (size_t i = 0; i < want_columns.size(); ++i) {
    const bool same_value = (std::isnan(values[i]) && std::isnan(want_values[i])) ||
                            values[i] == want_values[i];
    if (columns[i] != want_columns[i] || !same_value) {
      return ::testing::AssertionFailure()
             << "entry " << i << ": column " << columns[i] << " value " << values[i]
             << ", expected column " << want_columns[i] << " value " << want_values[i];
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
void check_against_full_sort(uint32_t seed) {
  std::mt19937 rng(seed);
  struct Skip {
    int a, b;
  };
  // No skip; pad 0 and bos 2 as the decoders pass them; one skip twice; the last column;
  // a skip past the row (nothing skipped).
  const std::vector<Skip> skips = {{-1, -1}, {0, 2}, {3, 3}, {-1, 0}, {40, -1}};
  for (const int width : {1, 2, 5, 37, 301}) {
    for (const Skip& skip : skips) {
      const int selectable = row_top_k_selectable(width, skip.a, skip.b);
      for (const int k : {1, 2, 3, 8, 42, selectable}) {
        if (k < 1 || k > selectable) continue;
        for (const bool specials : {false, true}) {
          SCOPED_TRACE("width " + std::to_string(width) + " k " + std::to_string(k) +
                       " skip " + std::to_string(skip.a) + "," + std::to_string(skip.b) +
                       (specials ? " with inf/NaN" : ""));
          const int rows = 7;
          const std::vector<T> x = tie_heavy_rows<T>(static_cast<size_t>(rows) * width, rng,
                                                     specials);
          std::vector<T> want_values, values(static_cast<size_t>(rows) * k);
          std::vector<int32_t> want_columns, columns(static_cast<size_t>(rows) * k);
          sorted_top_k(want_values, want_columns, x, rows, width, k, skip.a, skip.b);
          cpu::row_top_k<T>(values.data(), columns.data(), x.data(), rows, width, k, skip.a,
                            skip.b);
          ASSERT_TRUE(same_choice(values, columns, want_values, want_columns));
        }
      }
    }
  }
}

TEST(RowTopK, EqualsAFullSortOfEachRowWithTiesInfinitiesAndNaN) {
  check_against_full_sort<float>(41);
  check_against_full_sort<double>(42);
}

TEST(RowTopK, ThroughTheBackendOnAModelsVocabulary) {
  // The decoding shape: 400 hypotheses (100 sentences x beam 4) over a 37000-token
  // vocabulary, the best 8 each, rows of random log-probabilities.
  auto backend = make_cpu_backend(DType::F32);
  std::mt19937 rng(43);
  const int rows = 400, width = 37000, k = 8;
  std::vector<float> x = random_values(static_cast<size_t>(rows) * width, rng, -20.0f, -0.01f);
  Scope scope(*backend);
  const Tensor entries = scope.put(DType::F32, x);
  const Tensor values = scope.alloc(DType::F32, int64_t(rows) * k);
  int32_t* columns = scope.put_ids(std::vector<int32_t>(static_cast<size_t>(rows) * k, -1));
  backend->row_top_k(values, columns, entries, rows, width, k, 0, 2);
  std::vector<int32_t> got_columns(static_cast<size_t>(rows) * k);
  backend->download_ids(got_columns.data(), columns, int64_t(rows) * k);
  std::vector<float> want_values;
  std::vector<int32_t> want_columns;
  sorted_top_k(want_values, want_columns, x, rows, width, k, 0, 2);
  EXPECT_TRUE(same_choice(scope.get(values), got_columns, want_values, want_columns));
}

TEST(RowTopK, RejectsMoreThanTheSelectableColumns) {
  std::vector<float> x(10, -1.0f), values(10);
  std::vector<int32_t> columns(10);
  // 5 columns, two skipped: at most 3.
  expect_error([&] { check_row_top_k(2, 5, 4, 0, 2); },
               {"best 4 of 3 selectable", "5 columns"});
  expect_error([&] { check_row_top_k(2, 5, 0, -1, -1); }, {"best 0 of 5"});
  auto backend = make_cpu_backend(DType::F32);
  Scope scope(*backend);
  const Tensor entries = scope.put(DType::F32, x);
  const Tensor out = scope.alloc(DType::F32, 10);
  int32_t* ids = scope.put_ids(columns);
  expect_error([&] { backend->row_top_k(out, ids, entries, 2, 5, 4, 0, 2); },
               {"best 4 of 3 selectable"});
  // The tensors must hold rows x k values and rows x width entries.
  expect_error([&] { backend->row_top_k(out, ids, entries, 3, 5, 2, -1, -1); },
               {"row_top_k", "10 entries for 3 x 5"});
}

// The CUDA op against the CPU reference: identical columns and values (no tolerance:
// see the top of this file), in fp32 and from bf16 rows, at a small odd width (fewer
// columns than a block has threads) and at a model's vocabulary, with and without the
// decoders' skips, k from 1 to the parser's 2 * 21 and beyond (65: more passes than the
// device kernel makes for any decoder's 2 * beam).
TEST(CudaRowTopK, MatchesCpu) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(44);
    for (const int width : {97, 37003}) {
      for (const int k : {1, 8, 42, 65}) {
        for (const bool skip : {false, true}) {
          SCOPED_TRACE("width " + std::to_string(width) + " k " + std::to_string(k) + " in " +
                       dtype_name(dtype) + (skip ? " skipping 0 and 2" : ""));
          Twins twins(dtype);
          const int rows = width > 1000 ? 13 : 401;
          // Random rows, with ties from a coarse grid in a third of them and inf/NaN in one.
          std::vector<float> x = random_values(static_cast<size_t>(rows) * width, rng, -9.0f,
                                               -0.01f);
          const std::vector<float> ties =
              tie_heavy_rows<float>(static_cast<size_t>(rows) * width, rng, false);
          for (int r = 0; r < rows; r += 3) {
            std::copy_n(ties.begin() + int64_t(r) * width, width, x.begin() + int64_t(r) * width);
          }
          x[5] = std::numeric_limits<float>::quiet_NaN();
          x[6] = std::numeric_limits<float>::infinity();
          x[7] = -std::numeric_limits<float>::infinity();
          x = representable(x, dtype);
          const int skip_a = skip ? 0 : -1, skip_b = skip ? 2 : -1;
          auto run = [&](Backend& backend, DType type, std::vector<int32_t>& columns) {
            Scope scope(backend);
            const Tensor entries = scope.put(type, x);
            const Tensor values = scope.alloc(DType::F32, int64_t(rows) * k);
            int32_t* ids = scope.put_ids(std::vector<int32_t>(size_t(rows) * k, -1));
            backend.row_top_k(values, ids, entries, rows, width, k, skip_a, skip_b);
            columns.resize(size_t(rows) * k);
            backend.download_ids(columns.data(), ids, int64_t(rows) * k);
            return scope.get(values);
          };
          std::vector<int32_t> cpu_columns, gpu_columns;
          const std::vector<float> cpu_values = run(*twins.cpu, DType::F32, cpu_columns);
          const std::vector<float> gpu_values = run(*twins.gpu, dtype, gpu_columns);
          EXPECT_TRUE(same_choice(gpu_values, gpu_columns, cpu_values, cpu_columns));
          // The twin line bench/gpu_session.sh collects: here the count of entries that
          // differ in column, against a tolerance of none.
          size_t differ = 0;
          for (size_t i = 0; i < cpu_columns.size(); ++i) differ += gpu_columns[i] != cpu_columns[i];
          std::printf("twin CudaRowTopK.MatchesCpu: %zu of %zu columns differ, tolerance 0\n",
                      differ, cpu_columns.size());
        }
      }
    }
  }
}

}  // namespace
}  // namespace thpc::test
