// What every optimizer checks, the same way: the hyper-parameters its factory reads and
// the state its load_state() is given; and the download save_state() needs.
#include <cmath>
#include <sstream>

#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay::optim {
namespace {

// A hyper-parameter as a message shows it: six significant digits, so that a float read
// from a config shows as it was written ("0.9", not 0.899999976).
std::string shown(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

InputError bad_hyperparameter(const std::string& name, const std::string& field,
                              const std::string& why) {
  return InputError("optimizer '" + name + "': " + field + " " + why);
}

void require_fraction(const std::string& name, const std::string& field, double value) {
  if (!(value >= 0 && value < 1))
    throw bad_hyperparameter(name, field, "must be in [0, 1), got " + shown(value));
}

void require_positive(const std::string& name, const std::string& field, double value) {
  if (!(value > 0) || !std::isfinite(value))
    throw bad_hyperparameter(name, field, "must be a positive number, got " + shown(value));
}

void require_non_negative(const std::string& name, const std::string& field, double value) {
  if (!(value >= 0) || !std::isfinite(value))
    throw bad_hyperparameter(name, field, "must be a finite number >= 0, got " + shown(value));
}

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

}  // namespace hearsay::optim
