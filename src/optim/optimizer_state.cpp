// The checks every optimizer's load_state() makes, and the download save_state() needs.
#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay::optim {

void check_state(const OptimizerState& s, const std::string& name,
                 const std::vector<std::string>& kept, size_t n, const std::string& where) {
  if (s.optimizer != name) {
    throw InputError(where + ": holds the state of optimizer '" + s.optimizer +
                     "', but this config's optim.optimizer is '" + name +
                     "'; resume with the same optimizer, or start afresh without this checkpoint");
  }
  if (s.steps < 0)
    throw InputError(where + ": the optimizer's step count is negative (" +
                     std::to_string(s.steps) + ")");
  for (const auto& [buffer, values] : s.buffers) {
    bool known = false;
    for (const std::string& k : kept) known = known || k == buffer;
    if (!known)
      throw InputError(where + ": holds a buffer '" + buffer + "' that optimizer '" + name +
                       "' does not keep");
    if (values.size() != n) {
      throw InputError(where + ": the optimizer's buffer '" + buffer + "' holds " +
                       std::to_string(values.size()) + " values, the model has " +
                       std::to_string(n) + " parameters");
    }
  }
}

std::vector<float> download_floats(Backend& backend, const float* src, size_t n) {
  std::vector<float> out;
  if (src == nullptr) return out;
  out.resize(n);
  backend.download(out.data(), src, sizeof(float) * n);
  return out;
}

}  // namespace hearsay::optim
