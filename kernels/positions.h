// The sinusoidal position encodings of §3.5, shared by every backend: the model computes
// the table once on the host and uploads it (it is a constant, not an op).
#pragma once

namespace thpc {

// [max_len, d] row-major:
//   PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
// Computed in double, so a float table holds the correctly rounded values of the formula.
// Instantiated for float and double.
template <typename T>
void sinusoidal_positions(T* table, int max_len, int d);

}  // namespace thpc
