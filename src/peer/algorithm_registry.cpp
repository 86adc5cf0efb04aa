#include "algorithm_registry.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <stdexcept>

#include "hearsay/registry.h"

namespace hearsay {
namespace {

// Built before any registration runs (a function's static), whatever the order in which
// the source files' initializers run.
NamedRegistry<AlgorithmEntry>& entries() {
  static NamedRegistry<AlgorithmEntry> all("algorithm");
  return all;
}

class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (first.empty()) first = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string first;
};

}  // namespace

const char* message_kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::kGradient: return "gradient";
    case MessageKind::kModel: return "model";
    case MessageKind::kModelDelta: return "model delta";
    case MessageKind::kPushSum: return "push-sum share";
  }
  return "?";
}

Compression AlgorithmEntry::compression_of(MessageKind kind) const {
  for (const SendRule& r : sends) {
    if (r.kind == kind) return r.compression;
  }
  throw std::logic_error("algorithm " + name + " sends a " + message_kind_name(kind) +
                         " message but did not declare that kind when it registered");
}

bool register_algorithm(AlgorithmEntry entry) {
  if (entry.options == nullptr || !entry.make) {
    throw std::logic_error("register_algorithm: '" + entry.name + "' needs an options message and a factory");
  }
  const std::string name = entry.name;
  entries().add(name, std::move(entry));
  return true;
}

std::vector<std::string> gossip_algorithms() { return entries().names(); }

const AlgorithmEntry* find_algorithm(const std::string& name) { return entries().find(name); }

const AlgorithmEntry& algorithm_entry(const std::string& name) { return entries().get(name); }

bool is_synchronous(const std::string& algorithm) {
  const AlgorithmEntry* e = find_algorithm(algorithm);
  return e != nullptr && e->synchronous;
}

std::unique_ptr<google::protobuf::Message> parse_algorithm_options(const AlgorithmEntry& entry, const std::string& text) {
  std::unique_ptr<google::protobuf::Message> options(entry.options->New());
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, options.get())) {
    throw InputError(entry.name + " options (" + entry.options->GetDescriptor()->full_name() + "): " + errors.first);
  }
  return options;
}

}  // namespace hearsay
