// What a checkpoint holds, checked and converted: its provenance against this run's, its
// values' bounds, and the optimizer's and the sampler's state to and from its message.
// The file itself: checkpoint_file.cpp.
#include "hearsay/checkpoint.pb.h"
#include "hearsay/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "hearsay/error.h"
#include "hearsay/wire.h"

namespace hearsay {

std::string checkpoint_provenance_mismatch(const ckpt::Checkpoint& c, const CheckpointExpectation& want) {
  std::string why;
  auto differs = [&](const std::string& what) { why += (why.empty() ? "" : "; ") + what; };
  if (c.peer() != want.peer) differs("it is peer '" + wire_text(c.peer()) + "'s, this is '" + want.peer + "'");
  if (c.has_cluster() && c.cluster() != want.cluster) {
    differs("it is of cluster '" + wire_text(c.cluster()) + "', this is " + (want.cluster.empty() ? "a peer alone" : "'" + want.cluster + "'"));
  }
  if (c.has_training_digest() && !want.training_digest.empty() && c.training_digest() != want.training_digest) {
    // Part by part ("seed=1;model=ab12cd34;..."): the parts that differ, by name.
    auto parts = [](const std::string& digest) {
      std::map<std::string, std::string> out;
      std::stringstream in(digest);
      for (std::string part; std::getline(in, part, ';');) {
        const size_t eq = part.find('=');
        if (eq != std::string::npos) out[part.substr(0, eq)] = part.substr(eq + 1);
      }
      return out;
    };
    const auto theirs = parts(c.training_digest()), ours = parts(want.training_digest);
    std::string which;
    for (const auto& [name, value] : ours) {
      const auto it = theirs.find(name);
      if (it == theirs.end() || it->second != value) which += (which.empty() ? "" : ", ") + name;
    }
    for (const auto& [name, value] : theirs) {
      if (!ours.count(name)) which += (which.empty() ? "" : ", ") + name;
    }
    std::string optimizers;
    if (!want.optimizer.empty() && c.optimizer() != want.optimizer) {
      optimizers = "; optimizer '" + wire_text(c.optimizer()) + "' there, '" + want.optimizer + "' here";
    }
    differs("it was trained under another config (its " + (which.empty() ? std::string("training digest") : wire_text(which)) +
            " differs from this config's" + optimizers + ")");
  }
  return why;
}

namespace {

// The first value of `bytes` (little-endian floats) that is not finite or exceeds `bound`.
std::string first_bad_value(const char* bytes, size_t size, float bound) {
  const size_t n = size / 4;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, bytes + 4 * i, 4);
    if (!std::isfinite(v) || std::fabs(v) > bound) return "element " + std::to_string(i) + " is " + std::to_string(v);
  }
  return {};
}

std::string first_bad_value(const std::string& bytes, float bound) { return first_bad_value(bytes.data(), bytes.size(), bound); }

}  // namespace

void vet_checkpoint_values(const ckpt::Checkpoint& c, const CheckpointExpectation& want, const std::string& where,
                           const float* params) {
  auto refuse = [&](const std::string& why) { return InputError(where + ": " + why + "; refusing to load it"); };
  if (c.num_params() != want.num_params) {
    throw refuse("holds a model of " + std::to_string(c.num_params()) + " parameters, this config's has " + std::to_string(want.num_params));
  }
  if (c.step() < 0 || c.step() > want.last_step) {
    throw refuse("its step " + std::to_string(c.step()) + " is outside this run's 0.." + std::to_string(want.last_step));
  }
  if (!std::isfinite(c.wall_s()) || c.wall_s() < 0 || c.wall_s() > 1e9) throw refuse("its time (wall_s " + std::to_string(c.wall_s()) + ") is not a time");
  if (params == nullptr && c.params().size() != 4 * want.num_params) {
    throw refuse("its parameters are " + std::to_string(c.params().size()) + " bytes, not " + std::to_string(4 * want.num_params));
  }
  const char* param_bytes = params != nullptr ? reinterpret_cast<const char*>(params) : c.params().data();
  if (const std::string bad = first_bad_value(param_bytes, 4 * want.num_params, kMaxCheckpointValue); !bad.empty()) {
    throw refuse("parameter " + bad + " (finite and within " + std::to_string(static_cast<int64_t>(kMaxCheckpointValue)) + " expected)");
  }
  // The optimizer's state: finite, and far looser bounds (AdamW's second moment is a square).
  for (const auto* field : {&c.velocity(), &c.adam_m(), &c.adam_v()}) {
    if (const std::string bad = first_bad_value(*field, 1e30f); !bad.empty()) throw refuse("optimizer state " + bad);
  }
  for (const ckpt::OptimizerBuffer& b : c.optimizer_buffers()) {
    if (const std::string bad = first_bad_value(b.values(), 1e30f); !bad.empty()) {
      throw refuse("optimizer buffer '" + wire_text(b.name()) + "' " + bad);
    }
  }
}

std::string floats_to_bytes(const float* v, size_t n) { return std::string(reinterpret_cast<const char*>(v), 4 * n); }

void bytes_to_floats(const std::string& bytes, float* out, size_t n, const std::string& what) {
  if (bytes.size() != 4 * n) {
    throw InputError(what + ": " + std::to_string(bytes.size()) + " bytes, expected " + std::to_string(4 * n) + " (" +
                     std::to_string(n) + " floats); the checkpoint is of another model");
  }
  if (n > 0) std::memcpy(out, bytes.data(), 4 * n);
}

void save_optimizer_state(const OptimizerState& s, ckpt::Checkpoint& c) {
  c.set_optimizer(s.optimizer);
  c.set_optimizer_steps(s.steps);
  for (const auto& [name, values] : s.buffers) {
    ckpt::OptimizerBuffer* b = c.add_optimizer_buffers();
    b->set_name(name);
    b->set_values(floats_to_bytes(values.data(), values.size()));
  }
}

OptimizerState load_optimizer_state(const ckpt::Checkpoint& c, const std::string& where) {
  const auto known = optimizers().names();
  if (std::find(known.begin(), known.end(), c.optimizer()) == known.end()) {
    std::string list;
    for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
    throw InputError(where + ": holds the state of an unknown optimizer '" + c.optimizer() + "' (known: " + list + ")");
  }
  OptimizerState s;
  s.optimizer = c.optimizer();
  s.steps = c.optimizer_steps();
  auto add = [&](const std::string& name, const std::string& bytes) {
    if (bytes.size() % 4 != 0) {
      throw InputError(where + ": the optimizer's buffer '" + name + "' has " + std::to_string(bytes.size()) +
                       " bytes, not a whole number of floats");
    }
    std::vector<float> values(bytes.size() / 4);
    bytes_to_floats(bytes, values.data(), values.size(), where + ": optimizer buffer '" + name + "'");
    if (!s.buffers.emplace(name, std::move(values)).second) {
      throw InputError(where + ": the optimizer's buffer '" + name + "' appears twice");
    }
  };
  // Before optimizer_buffers, SGD's velocity and AdamW's moments had fields of their own.
  if (!c.velocity().empty()) add("velocity", c.velocity());
  if (!c.adam_m().empty()) add("m", c.adam_m());
  if (!c.adam_v().empty()) add("v", c.adam_v());
  for (const ckpt::OptimizerBuffer& b : c.optimizer_buffers()) add(b.name(), b.values());
  return s;
}

void save_sampler_state(const BatchSampler::State& s, ckpt::Checkpoint& c) {
  c.set_sampler_epoch(s.epoch);
  c.set_sampler_pos(s.pos);
  c.clear_sampler_order();
  for (int64_t i : s.order) c.add_sampler_order(i);
}

BatchSampler::State load_sampler_state(const ckpt::Checkpoint& c) {
  BatchSampler::State s;
  s.epoch = c.sampler_epoch();
  s.pos = c.sampler_pos();
  s.order.assign(c.sampler_order().begin(), c.sampler_order().end());
  return s;
}

}  // namespace hearsay
