// Sweeps: a config field named by its dotted path becomes a text-format fragment (the
// field's type, read from the schema, decides the quoting), and the axes' values expand
// into one run per grid point and repeat.
#include <google/protobuf/descriptor.h>

#include <sstream>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"

namespace hearsay {

namespace pb = google::protobuf;

std::string field_fragment(const std::string& path, const std::string& value) {
  std::vector<std::string> names;
  std::stringstream parts(path);
  for (std::string part; std::getline(parts, part, '.');) names.push_back(part);
  if (names.empty()) throw InputError("sweep field '': empty path");
  const pb::Descriptor* desc = config::Config::descriptor();
  std::string open, close;
  for (size_t i = 0; i < names.size(); ++i) {
    const pb::FieldDescriptor* f = desc->FindFieldByName(names[i]);
    if (f == nullptr) throw InputError("sweep field '" + path + "': " + desc->full_name() + " has no field '" + names[i] + "'");
    const bool last = i + 1 == names.size();
    if (!last) {
      if (f->type() != pb::FieldDescriptor::TYPE_MESSAGE || f->is_repeated()) {
        throw InputError("sweep field '" + path + "': '" + names[i] + "' is not a single message, so it has no fields to sweep");
      }
      open += names[i] + " { ";
      close = " }" + close;
      desc = f->message_type();
      continue;
    }
    if (f->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      return open + names[i] + " { " + value + " }" + close;  // a whole sub-message, written out
    }
    std::string v = value;
    const bool text = f->type() == pb::FieldDescriptor::TYPE_STRING || f->type() == pb::FieldDescriptor::TYPE_BYTES;
    if (text && !(v.size() >= 2 && v.front() == '"' && v.back() == '"')) {
      std::string quoted = "\"";
      for (char c : v) {
        if (c == '"' || c == '\\') quoted += '\\';
        quoted += c;
      }
      v = quoted + "\"";
    }
    return open + names[i] + ": " + v + close;
  }
  return {};
}

std::vector<SweepPoint> sweep_points(const config::Config& c) {
  const auto& e = c.experiment();
  std::vector<SweepPoint> grid(1);
  for (const auto& axis : e.sweep()) {
    const std::string key = axis.name().empty() ? axis.field().substr(axis.field().rfind('.') + 1) : axis.name();
    std::vector<SweepPoint> next;
    for (const auto& point : grid) {
      for (int v = 0; v < axis.values_size(); ++v) {
        SweepPoint p = point;
        p.values.emplace_back(key, axis.values(v));
        p.sets.push_back(field_fragment(axis.field(), axis.values(v)));
        if (v < axis.also_set_size() && !axis.also_set(v).empty()) p.sets.push_back(axis.also_set(v));
        next.push_back(std::move(p));
      }
    }
    grid = std::move(next);
  }
  std::vector<SweepPoint> out;
  for (const auto& point : grid) {
    for (int r = 0; r < e.repeats(); ++r) {
      SweepPoint p = point;
      p.repeat = r;
      if (r > 0) p.sets.push_back("seed: " + std::to_string(c.seed() + static_cast<uint64_t>(r)));
      p.index = static_cast<int>(out.size());
      out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace hearsay
