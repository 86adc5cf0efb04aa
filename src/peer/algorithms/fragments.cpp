#include "fragments.h"

#include <algorithm>
#include <cctype>

#include "hearsay/error.h"

namespace hearsay {

std::string unit_of(const std::string& name) {
  size_t begin = 0;
  while (begin <= name.size()) {
    const size_t end = std::min(name.find('.', begin), name.size());
    const bool number = end > begin && std::all_of(name.begin() + static_cast<long>(begin), name.begin() + static_cast<long>(end),
                                                   [](unsigned char ch) { return std::isdigit(ch) != 0; });
    if (number) return name.substr(0, end);
    if (end == name.size()) break;
    begin = end + 1;
  }
  return name.substr(0, name.find('.'));
}

std::vector<Fragment> fragments_of(const Trainable& model, int p) {
  std::vector<std::string> units;
  std::vector<Fragment> out(static_cast<size_t>(p));
  for (const ParamView& v : model.param_views()) {
    const std::string u = unit_of(v.name);
    if (units.empty() || units.back() != u) units.push_back(u);
    out[(units.size() - 1) % static_cast<size_t>(p)].emplace_back(v.offset, v.size);
  }
  if (units.size() < static_cast<size_t>(p)) {
    throw InputError("streaming_diloco: fragments " + std::to_string(p) + " but the model has " +
                     std::to_string(units.size()) + " units to deal out (cluster.gossip.[hearsay.algorithms."
                     "streaming_diloco].fragments)");
  }
  return out;
}

}  // namespace hearsay
