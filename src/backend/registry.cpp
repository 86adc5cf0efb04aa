// The one place that knows which backends this build contains.
#include <charconv>

#include "cpu/cpu_backend.h"
#include "hearsay/backend.h"
#include "hearsay/build_config.h"
#include "hearsay/error.h"
#if HEARSAY_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace hearsay {

std::unique_ptr<Backend> create_backend(const std::string& device, int threads) {
  if (device == "cpu") return create_cpu_backend(threads);
  if (device.rfind("cuda", 0) == 0) {
    int index = 0;
    if (device.size() > 4) {
      const char* first = device.data() + 5;
      const char* last = device.data() + device.size();
      auto [ptr, ec] = std::from_chars(first, last, index);
      if (device[4] != ':' || ec != std::errc() || ptr != last || index < 0) {
        throw InputError("device '" + device + "': expected 'cuda' or 'cuda:N' with N >= 0");
      }
    }
#if HEARSAY_HAVE_CUDA
    return create_cuda_backend(index);
#else
    throw InputError("device '" + device + "': this build has no CUDA backend (built with HEARSAY_CUDA=OFF or without nvcc)");
#endif
  }
  throw InputError("device '" + device + "': unknown device; use 'cpu' or 'cuda:N'");
}

std::vector<std::string> available_devices() {
  std::vector<std::string> devices{"cpu"};
#if HEARSAY_HAVE_CUDA
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back("cuda:" + std::to_string(i));
#endif
  return devices;
}

}  // namespace hearsay
