// A check the HDF5 readers (shards, checkpoints) make before allocating for a dataset:
// its header states an extent, and a damaged header can state any, up to 2^64 values.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <limits>

namespace thpc {

// Whether `dataset` really holds `count` values of `value_size` bytes: its layout stores
// exactly that many bytes (the readers' datasets are contiguous, unfiltered), and they
// fit in the file. False for an extent that a damaged header made up.
inline bool stores_values(hid_t dataset, hsize_t count, size_t value_size) {
  if (count > std::numeric_limits<hsize_t>::max() / value_size) return false;
  const hsize_t stored = H5Dget_storage_size(dataset);
  if (stored != count * value_size) return false;
  const hid_t file = H5Iget_file_id(dataset);
  if (file < 0) return false;
  hsize_t file_size = 0;
  const bool fits = H5Fget_filesize(file, &file_size) >= 0 && stored <= file_size;
  H5Fclose(file);
  return fits;
}

}  // namespace thpc
