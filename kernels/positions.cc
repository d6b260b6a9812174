#include "kernels/positions.h"

#include <cmath>
#include <cstdint>

namespace thpc {

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

template void sinusoidal_positions<float>(float*, int, int);
template void sinusoidal_positions<double>(double*, int, int);

}  // namespace thpc
