// An HDF5 file opened read-only and its variable-length string datasets, for the tests
// that read what the programs write (attention dumps).
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

namespace thpc {

struct File {
  explicit File(const std::string& path) : id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
  ~File() {
    if (id >= 0) H5Fclose(id);
  }
  hid_t id;
};

// A variable-length string dataset, scalar (one string) or one-dimensional.
inline std::vector<std::string> read_strings(const File& file, const std::string& path) {
  const hid_t dataset = H5Dopen2(file.id, path.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << path;
  if (dataset < 0) return {};
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hid_t space = H5Dget_space(dataset);
  std::vector<char*> pointers(H5Sget_simple_extent_npoints(space));
  EXPECT_GE(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), 0);
  std::vector<std::string> values(pointers.begin(), pointers.end());
  H5Dvlen_reclaim(type, space, H5P_DEFAULT, pointers.data());
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(dataset);
  return values;
}

}  // namespace thpc
