// Where a config's fields were written, for its errors' "FILE:LINE:COL" (config_loader.cpp
// is its one user): the parser's first error, and the Locator that finds a field by its
// path in the sources' text.
#pragma once

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace hearsay::config_text {

namespace pb = google::protobuf;

class CollectFirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (!first_.empty()) return;
    // The parser quotes what it could not read: a 10 MB token stays out of a one-line message.
    constexpr size_t kShown = 512;
    first_ = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message.substr(0, kShown);
    if (message.size() > kShown) first_ += "... (" + std::to_string(message.size()) + " bytes)";
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// The one place every config check gets its "FILE:LINE:COLUMN: field" prefix from: finds
// where a field was written, by its dotted path with indices for repeated fields
// ("cluster.site_links[1].link.latency_ms"), reading the sources' text again in the order
// they were merged (the file, then each --set). It places a value where the parser took
// it from: a singular field where it was last written (a config may write a block twice,
// `train { ... } train { ... }`, and text format merges the two, the later value
// winning), the n-th element of a repeated field at the n-th written, counted across
// blocks and sources (merging appends). protobuf's ParseInfoTree cannot say this: it
// keeps only the first of a merged block's trees. A field no source wrote (a default, or
// a combination of fields) is placed in the file alone: "FILE: field". The text is read
// only when an error asks for a place.
class Locator {
 public:
  struct Source {
    std::string name;
    const std::string* text;  // outlives the locator
  };
  explicit Locator(std::vector<Source> sources) : sources_(std::move(sources)) {}

  std::string at(const std::string& path) const {
    // "a.b[2].c" -> (a, -1), (b, 2), (c, -1); an extension is named in brackets, dots
    // and all: "cluster.gossip.[hearsay.algorithms.choco].consensus_step".
    std::vector<Part> parts;
    const pb::Descriptor* desc = config::Config::descriptor();
    for (size_t at = 0; at < path.size();) {
      std::string name;
      int index = -1;
      size_t end = 0;
      const bool extension = path[at] == '[' && (end = path.find(']', at)) != std::string::npos;
      if (extension) {
        name = path.substr(at + 1, end - at - 1);
        at = end + 2;
      } else {
        end = std::min(path.find('.', at), path.size());
        name = path.substr(at, end - at);
        const auto open = name.find('[');
        if (open != std::string::npos) {
          index = std::atoi(name.c_str() + open + 1);
          name.resize(open);
        }
        at = end + 1;
      }
      const pb::FieldDescriptor* field =
          desc == nullptr ? nullptr
          : extension     ? pb::DescriptorPool::generated_pool()->FindExtensionByName(name)
                          : desc->FindFieldByName(name);
      if (field == nullptr) return sources_.front().name + ": " + path;
      parts.push_back({name, extension, field->is_repeated(), field->is_repeated() ? std::max(index, 0) : -1});
      desc = field->message_type();
    }
    Walk walk(parts);
    for (const Source& s : sources_) walk.read(s);
    if (walk.found.source == nullptr) return sources_.front().name + ": " + path;
    return walk.found.source->name + ":" + std::to_string(walk.found.line + 1) + ":" + std::to_string(walk.found.column + 1) +
           ": " + path;
  }

 private:
  struct Part {
    std::string name;  // a field's name, or an extension's full name
    bool extension, repeated;
    int index;  // repeated: which element; else -1
  };

  // One search for a path through the sources' tokens, as protobuf's text parser reads
  // them. The sources were parsed without error, so the grammar is taken as given; text
  // that does not read as expected ends the search with what it has found.
  class Walk {
   public:
    explicit Walk(const std::vector<Part>& target) : target_(target), seen_(target.size(), 0) {}

    struct Place {
      const Source* source = nullptr;
      int line = 0, column = 0;
    } found;

    void read(const Source& s) {
      pb::io::ArrayInputStream in(s.text->data(), static_cast<int>(s.text->size()));
      CollectFirstError ignored;
      pb::io::Tokenizer tokens(&in, &ignored);
      // As pb::TextFormat::Parser sets its tokenizer, so that lines and columns agree.
      tokens.set_allow_f_after_float(true);
      tokens.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
      t_ = &tokens;
      source_ = &s;
      t_->Next();
      message(0, "");
      t_ = nullptr;
    }

   private:
    bool symbol(const char* s) const {
      return t_->current().type == pb::io::Tokenizer::TYPE_SYMBOL && t_->current().text == s;
    }
    bool at_end() const { return t_->current().type == pb::io::Tokenizer::TYPE_END; }

    // Fields up to `close` ("}" or ">"; empty: the end of the text), which is consumed.
    // depth: how many of the target's parts lead to this message; -1: it is off the path.
    bool message(int depth, const std::string& close) {
      for (;;) {
        if (at_end()) return close.empty();
        if (!close.empty() && symbol(close.c_str())) {
          t_->Next();
          return true;
        }
        if (!field(depth)) return false;
        if (symbol(";") || symbol(",")) t_->Next();
      }
    }

    bool field(int depth) {
      const pb::io::Tokenizer::Token name_token = t_->current();
      std::string name;
      const bool extension = symbol("[");
      if (extension) {
        for (t_->Next(); !symbol("]"); t_->Next()) {
          if (at_end()) return false;
          name += t_->current().text;
        }
      } else if (name_token.type == pb::io::Tokenizer::TYPE_IDENTIFIER) {
        name = name_token.text;
      } else {
        return false;
      }
      t_->Next();
      if (symbol(":")) t_->Next();
      const bool on_path = depth >= 0 && depth < static_cast<int>(target_.size()) && target_[depth].name == name &&
                           target_[depth].extension == extension;
      if (!on_path) return skip_value();
      const Part& part = target_[depth];
      const bool last = depth + 1 == static_cast<int>(target_.size());
      // The short form of a repeated field, "hidden: [8, 16]": each element is placed at
      // its value.
      const bool list = symbol("[");
      if (list) {
        t_->Next();
        if (symbol("]")) {
          t_->Next();
          return true;
        }
      }
      for (;;) {
        const int line = list ? t_->current().line : name_token.line;
        const int column = list ? t_->current().column : name_token.column;
        const bool hit = !part.repeated || seen_[depth]++ == part.index;
        if (hit && last) found = {source_, line, column};
        if (symbol("{") || symbol("<")) {
          const std::string close = symbol("{") ? "}" : ">";
          t_->Next();
          if (!message(hit && !last ? depth + 1 : -1, close)) return false;
        } else if (!scalar()) {
          return false;
        }
        if (!list) return true;
        if (symbol("]")) {
          t_->Next();
          return true;
        }
        if (!symbol(",")) return false;
        t_->Next();
      }
    }

    // A number, an identifier (an enum value, true, inf) or adjacent strings, maybe negated.
    bool scalar() {
      if (symbol("-")) t_->Next();
      const auto type = t_->current().type;
      if (type == pb::io::Tokenizer::TYPE_STRING) {
        while (t_->current().type == pb::io::Tokenizer::TYPE_STRING) t_->Next();
        return true;
      }
      if (type != pb::io::Tokenizer::TYPE_IDENTIFIER && type != pb::io::Tokenizer::TYPE_INTEGER &&
          type != pb::io::Tokenizer::TYPE_FLOAT) {
        return false;
      }
      t_->Next();
      return true;
    }

    // A value off the path: a scalar, or a block or list skipped whole.
    bool skip_value() {
      if (!symbol("{") && !symbol("<") && !symbol("[")) return scalar();
      int open = 0;
      do {
        if (at_end()) return false;
        if (symbol("{") || symbol("<") || symbol("[")) ++open;
        if (symbol("}") || symbol(">") || symbol("]")) --open;
        t_->Next();
      } while (open > 0);
      return true;
    }

    const std::vector<Part>& target_;
    std::vector<int> seen_;  // by depth: elements of the target's repeated field met so far
    pb::io::Tokenizer* t_ = nullptr;
    const Source* source_ = nullptr;
  };

  std::vector<Source> sources_;
};

}  // namespace hearsay::config_text
