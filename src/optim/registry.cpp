// The one list of optimizers: hearsay's own, in the order messages name them, and any a
// program adds with register_optimizer(). The config loader, the peer and the checkpoint
// reader all ask here; no other list of optimizer names exists.
#include <mutex>
#include <stdexcept>

#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay {
namespace {

struct Entry {
  std::string name;
  OptimizerFactory make;
};

struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;  // GUARDED_BY(mu)
};

// Built on first use (a function's static), so registering from another file's
// namespace-scope initializer finds it ready whatever the order of initialization.
Registry& registry() {
  static Registry r{{}, {{"sgd", optim::make_sgd}, {"adamw", optim::make_adamw}}};
  return r;
}

}  // namespace

void register_optimizer(const std::string& name, OptimizerFactory factory) {
  if (name.empty() || !factory)
    throw std::logic_error("register_optimizer: an optimizer needs a name and a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Entry& e : r.entries) {
    if (e.name == name)
      throw std::logic_error("register_optimizer: the name '" + name + "' is registered twice");
  }
  r.entries.push_back({name, std::move(factory)});
}

std::vector<std::string> optimizer_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const Entry& e : r.entries) names.push_back(e.name);
  return names;
}

std::unique_ptr<Optimizer> create_optimizer(Backend& backend, size_t n, const OptimizerSpec& spec) {
  OptimizerFactory make;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const Entry& e : r.entries) {
      if (e.name == spec.name) make = e.make;
    }
  }
  if (!make) {
    std::string known;
    for (const std::string& name : optimizer_names()) known += (known.empty() ? "" : ", ") + name;
    throw InputError("optimizer '" + spec.name + "': unknown; known optimizers: " + known);
  }
  return make(backend, n, spec);
}

}  // namespace hearsay
