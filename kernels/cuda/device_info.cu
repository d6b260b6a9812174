#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>

namespace thpc {

std::vector<CudaDeviceInfo> cuda_devices() {
  std::vector<CudaDeviceInfo> devices;
  int count = 0;
  // No driver or no device is a normal answer here: the CPU backend takes over.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return devices;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.index = index;
    info.name = prop.name;
    char bus_id[32] = {0};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index) == cudaSuccess) {
      info.pci_bus_id = bus_id;
    }
    info.compute_capability = prop.major * 10 + prop.minor;
    info.memory_bytes = prop.totalGlobalMem;
    devices.push_back(info);
  }
  return devices;
}

}  // namespace thpc
