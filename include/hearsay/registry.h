// A list of named things — algorithms, optimizers, topologies, staleness weightings — the
// one way hearsay keeps "which X exist": hearsay's own are there from the start, a
// program (or a source file, from a namespace-scope initializer) adds its own, and every
// reader (the engine, the config loader, error messages) asks the same list. Entries are
// never removed, so a pointer to one stays valid; adds and lookups may come from any
// thread.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/error.h"

namespace hearsay {

template <class Entry>
class NamedRegistry {
 public:
  // `kind` names what is listed, in errors ("optimizer", "topology").
  explicit NamedRegistry(std::string kind, std::vector<std::pair<std::string, Entry>> builtins = {})
      : kind_(std::move(kind)) {
    for (auto& [name, entry] : builtins) add(name, std::move(entry));
  }

  // Throws std::logic_error (a program's bug, not bad input) for an empty name or a
  // taken one.
  void add(const std::string& name, Entry entry) {
    if (name.empty()) throw std::logic_error("registering a " + kind_ + ": the name is empty");
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, e] : entries_) {
      if (n == name) throw std::logic_error("registering a " + kind_ + ": the name '" + name + "' is registered twice");
    }
    entries_.emplace_back(name, std::make_unique<const Entry>(std::move(entry)));
  }

  // The entry named `name`, or null.
  const Entry* find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, e] : entries_) {
      if (n == name) return e.get();
    }
    return nullptr;
  }

  // The entry named `name`; throws InputError "KIND 'NAME': unknown; use a, b, c".
  const Entry& get(const std::string& name) const {
    if (const Entry* e = find(name)) return *e;
    throw InputError(kind_ + " '" + name + "': unknown; use " + joined_names());
  }

  // Sorted, so that lists and errors do not depend on the order files registered in.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [n, e] : entries_) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // "a, b, c", for messages.
  std::string joined_names() const {
    std::string out;
    for (const auto& n : names()) out += (out.empty() ? "" : ", ") + n;
    return out;
  }

 private:
  std::string kind_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::unique_ptr<const Entry>>> entries_;  // GUARDED_BY(mu_)
};

}  // namespace hearsay
