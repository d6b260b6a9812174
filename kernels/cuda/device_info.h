// What CUDA devices this process sees (respecting CUDA_VISIBLE_DEVICES). Used to pick
// a backend (train.backend = auto) and to name the GPU in each rank's start-up line.
#pragma once

#include <string>
#include <vector>

namespace thpc {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;
  int compute_capability = 0;  // major * 10 + minor
  size_t memory_bytes = 0;
};

// The visible devices; empty when there is no driver or no device (never throws).
std::vector<CudaDeviceInfo> cuda_devices();

}  // namespace thpc
