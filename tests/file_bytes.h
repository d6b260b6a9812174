// Helpers shared by the suites that damage files on purpose (checkpoints, shards): where
// an HDF5 dataset's values lie in its file, and flipping bits there, as a failing disk or
// a bad copy would.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

namespace thpc {

// XORs the byte at `offset` of `path` with `mask`.
inline void flip_bits(const std::string& path, std::uintmax_t offset, unsigned char mask) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  char byte = 0;
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ static_cast<char>(mask));
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(&byte, 1);
}

// A checkpoint `file`'s 512-byte header with `change` applied, as a later version or a
// damaged disk could leave it (the header is outside the whole-file checksum: nothing to
// stamp again).
inline void edit_header(const std::string& file,
                        const std::function<void(std::string&)>& change) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string header(512, '\0');
  io.read(header.data(), 512);
  change(header);
  ASSERT_EQ(header.size(), 512u);
  io.seekp(0);
  io.write(header.data(), 512);
}

// Where a contiguous dataset's values start in the file.
inline std::uintmax_t dataset_offset(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t data = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  const haddr_t offset = H5Dget_offset(data);
  H5Dclose(data);
  H5Fclose(file);
  return offset;
}

}  // namespace thpc
