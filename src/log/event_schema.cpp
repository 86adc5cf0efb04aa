// The events a peer logs, field by field. Meanings are Markdown because docs/LOGS.md shows
// them verbatim in each event's table (tests/log/logs_doc_test.cpp compares the two).
#include "event_schema.h"

#include <nlohmann/json.hpp>

#include "hearsay/log.h"

namespace hearsay::log_schema {
namespace {

using Json = nlohmann::ordered_json;

Field required(std::string name, Type type, std::string meaning) {
  Field f;
  f.name = std::move(name);
  f.type = type;
  f.meaning = std::move(meaning);
  return f;
}

Field optional(std::string name, Type type, std::string meaning) {
  Field f = required(std::move(name), type, std::move(meaning));
  f.required = false;
  return f;
}

// An object keyed by run-time names (`key_is`), each value of `value_type`.
Field map_of(std::string name, std::string key_is, Type value_type, std::string meaning) {
  Field f = required(std::move(name), Type::kMap, std::move(meaning));
  f.key_is = std::move(key_is);
  f.value_type = value_type;
  return f;
}

std::vector<Event> build_events() {
  using T = Type;
  std::vector<Event> all;

  all.push_back(
      {"start",
       {
           required("device", T::kString, "where the peer computes: `cpu`, `cuda:0`"),
           required("model", T::kString, "the model config, in protobuf text format on one line"),
           required("params", T::kInteger, "number of parameters"),
           required("shard_size", T::kInteger, "training samples of this peer"),
           required("batch_size", T::kInteger, "samples per step"),
           required("total_steps", T::kInteger,
                    "steps the run will take unless a target stops it first"),
           required("target_test_acc", T::kNumber, "`train.target_test_acc` (0: no target)"),
           required("seed", T::kInteger, "the config's `seed`"),
           required("unix_time", T::kNumber,
                    "wall-clock seconds since 1970 at this event: with it, `t` of the events that "
                    "follow, up to the next `start`, place this incarnation's events among other "
                    "processes'"),
       }});

  all.push_back(
      {"step",
       {
           required("step", T::kInteger, "steps taken so far"),
           required("epoch", T::kNumber, "passes over this peer's shard so far (fractional)"),
           required("loss", T::kNumber,
                    "mean training loss over the steps since the previous `step` event"),
           required("lr", T::kNumber, "learning rate of the last step"),
           required("samples_per_s", T::kNumber,
                    "training throughput over those steps (evaluation time excluded)"),
       }});

  all.push_back(
      {"eval",
       {
           required("step", T::kInteger, "steps taken when the model was evaluated"),
           required("epoch", T::kNumber, "passes over this peer's shard so far (fractional)"),
           required("test_acc", T::kNumber, "accuracy on the test set, a fraction in [0, 1]"),
           required("test_loss", T::kNumber, "mean cross-entropy on the test set"),
           required("eval_s", T::kNumber, "seconds the evaluation took"),
       }});

  Field links = map_of("links", "neighbour", T::kMap,
                       "per neighbour, an object of the `links.*` fields below");
  links.members = {
      required("connected", T::kBoolean, "whether the link is up now"),
      required("bytes_sent", T::kInteger, "bytes sent to this neighbour so far"),
      required("bytes_received", T::kInteger, "bytes received from it so far"),
      required("queue", T::kInteger, "frames queued for it, emulated ones included"),
      optional("rtt_s", T::kNumber, "heartbeat round trip, once one was measured"),
      required("codec", T::kString, "what gradients or model deltas travel to it as now"),
      required("model_codec", T::kString, "what whole models travel to it as"),
      optional("density", T::kNumber,
               "for `codec` `topk` or `randomk`: the fraction of elements sent"),
      optional("throughput_Bps", T::kNumber,
               "measured over this peer's updates to it: bytes on the wire over the time they took "
               "to leave, smoothed; once measured"),
  };
  all.push_back(
      {"gossip",
       {
           required("step", T::kInteger, "steps taken"),
           required("clock", T::kInteger, "the peer's logical clock"),
           required("bytes_sent", T::kInteger,
                    "over all links, from the transport's per-link counters"),
           required("bytes_received", T::kInteger,
                    "over all links, from the transport's per-link counters"),
           required("applied", T::kInteger,
                    "updates the mixer applied since the previous `gossip` event"),
           required(
               "dropped", T::kInteger,
               "updates dropped as too stale (tau > tau_max) since the previous `gossip` event"),
           required("coalesced", T::kInteger,
                    "updates folded into a pending one (outbox or inbox) since the previous "
                    "`gossip` event"),
           required("rejected", T::kInteger,
                    "updates refused since the peer started: did not decode, non-finite values, a "
                    "norm over the bound, a synchronous flood, or from a quarantined neighbour "
                    "(each reason goes to stderr)"),
           required("tau_p50", T::kNumber,
                    "median staleness of the updates seen since the previous `gossip` event"),
           required("tau_p90", T::kNumber, "90th percentile of that staleness"),
           required("tau_p99", T::kNumber, "99th percentile of that staleness"),
           required("tau_max", T::kNumber,
                    "the largest staleness seen since the previous `gossip` event"),
           required("weight_mean", T::kNumber,
                    "mean mixing weight (model share or gradient scale) applied"),
           required("buffered_bytes", T::kInteger,
                    "memory held in this peer's outboxes and inbox (bounded)"),
           links,
           map_of("refused", "reason", T::kInteger,
                  "`rejected` by kind of reason: `non-finite`, `norm`, `synchronous`, `codec ...`"),
           required("quarantined", T::kStringArray,
                    "the neighbours quarantined now (`cluster.gossip.guard`)"),
           [] {
             Field f = map_of("model_distance", "neighbour", T::kNumber,
                              "per neighbour whose whole model arrived since the previous `gossip` "
                              "event: ‖x_i - y_j‖ at its first arrival, the drift seen from this "
                              "peer; absent when none arrived");
             f.required = false;
             return f;
           }(),
       }});

  all.push_back(
      {"link",
       {
           required("state", T::kString, "`up`, `down` or `rejected`"),
           required("neighbour", T::kString, "the neighbour's name"),
           required("address", T::kString, "the remote address"),
           required(
               "reason", T::kString,
               "for `down` and `rejected`: `bye: ...`, `connection closed by peer`, `admission: "
               "wrong proof (cluster secret differs)`, a frame error...; empty for `up`"),
       }});

  all.push_back(
      {"codec",
       {
           required("link", T::kString, "the neighbour"),
           required("payload", T::kString,
                    "`update` (gradients and model deltas) or `model` (whole models, which only "
                    "ever get a dense codec)"),
           required("codec", T::kString, "the codec chosen"),
           optional("density", T::kNumber, "for `topk`: the fraction of elements sent"),
           required("bandwidth_Bps", T::kNumber,
                    "the link's measured bandwidth the choice was made from"),
           required("step_s", T::kNumber, "the step time the choice was made from"),
           required("budget_bytes", T::kNumber, "`step_fraction` x step x bandwidth"),
           required("expected_bytes", T::kNumber, "what the chosen codec sends per update"),
           required("reason", T::kString,
                    "the choice in words, e.g. `int8 needs 273474 B; topk at density 0.0148 sends "
                    "23998 B of the budget 25000 B (0.5 of a 0.02 s step at 2.5 MB/s)`"),
       }});

  all.push_back(
      {"join",
       {
           required("from", T::kString, "the neighbour whose model this peer started from"),
           required("their_step", T::kInteger, "the steps that neighbour had taken"),
       }});

  all.push_back({"checkpoint",
                 {
                     required("step", T::kInteger, "the step the checkpoint holds"),
                     required("path", T::kString, "the checkpoint file"),
                     required("write_s", T::kNumber, "seconds the write took"),
                 }});

  all.push_back(
      {"resume",
       {
           required("step", T::kInteger, "the step the checkpoint holds: the peer's next step"),
           required("path", T::kString, "the checkpoint file"),
           required("their_wall_s", T::kNumber,
                    "seconds the peer had run before, over all its earlier incarnations"),
       }});

  all.push_back(
      {"consensus",
       {
           required("step", T::kInteger, "the step of every peer's snapshot"),
           required("distance", T::kNumber, "mean_i ‖x_i - mean_j x_j‖ over those snapshots"),
       }});

  all.push_back(
      {"quarantine",
       {
           required("step", T::kInteger, "steps taken"),
           required("neighbour", T::kString, "the neighbour"),
           required("state", T::kString,
                    "`on`: its updates failed `guard.strikes` checks in a row and are no longer "
                    "decoded or mixed; `off`: the cool-down is over and it is readmitted"),
           optional("for_s", T::kNumber, "with `on`: how long the quarantine lasts"),
           required("reason", T::kString,
                    "the last refusal, e.g. `non-finite: element 17 is NaN of segment 0`, `norm: "
                    "3.2e+06 is 1e+06 times this peer's model (3.2); the bound is 10 times`"),
       }});

  all.push_back({"diverged",
                 {
                     required("step", T::kInteger, "the step whose loss was not finite"),
                     required("lr", T::kNumber, "the learning rate of that step"),
                     required("after_neighbours", T::kBoolean,
                              "whether updates of neighbours were mixed in that step"),
                 }});

  all.push_back(
      {"end",
       {
           required("steps", T::kInteger, "steps taken"),
           required("epoch", T::kNumber, "passes over this peer's shard (fractional)"),
           required("final_test_acc", T::kNumber, "test accuracy of the last evaluation"),
           required("final_test_loss", T::kNumber, "test loss of the last evaluation"),
           required("train_s", T::kNumber, "seconds spent in training steps"),
           required("samples_per_s", T::kNumber, "training throughput over the whole run"),
           required("bytes_sent", T::kInteger,
                    "to every neighbour, whole frames (0 for a peer alone)"),
           required("time_to_target_s", T::kNumber,
                    "seconds until `train.target_test_acc` was first reached by this peer; `null` "
                    "if never or no target"),
           optional("bytes_to_target", T::kInteger,
                    "in a cluster, once the target was reached: what had been sent by then"),
           optional("emulated_step_s", T::kNumber, "with `train.emulated_step_s`: its value"),
           optional("compute_overruns", T::kInteger,
                    "with `train.emulated_step_s`: steps whose real computation took longer than "
                    "the emulated time (the base was too small for this machine's load, and the "
                    "run's pace is not the emulated one)"),
       }});
  return all;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::kInteger:
      return "integer";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kBoolean:
      return "boolean";
    case Type::kStringArray:
      return "array of strings";
    case Type::kMap:
      return "object";
  }
  return "?";
}

// What a value is, for messages: "a string", "null", "an integer".
std::string what_it_is(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

bool scalar_fits(Type type, const Json& v) {
  switch (type) {
    case Type::kInteger:
      return v.is_number_integer();
    case Type::kNumber:
      return v.is_number() || v.is_null();  // null: not finite
    case Type::kString:
      return v.is_string();
    case Type::kBoolean:
      return v.is_boolean();
    case Type::kStringArray:
      if (!v.is_array()) return false;
      for (const auto& item : v) {
        if (!item.is_string()) return false;
      }
      return true;
    case Type::kMap:
      return v.is_object();
  }
  return false;
}

std::string check_object(const Json& object, const std::vector<const std::vector<Field>*>& schemas,
                         const std::string& where, const std::string& prefix);

// `value` against `field`; `path` names it in messages ("links.b.queue").
std::string check_value(const Field& field, const Json& value, const std::string& where,
                        const std::string& path) {
  if (!scalar_fits(field.type, value)) {
    return where + ": field '" + path + "' is " + what_it_is(value) + ", the schema says " +
           type_text(field);
  }
  if (field.type != Type::kMap) return "";
  for (const auto& [key, item] : value.items()) {
    const std::string item_path = path + "." + key;
    if (!field.members.empty()) {
      if (!item.is_object())
        return where + ": field '" + item_path + "' is " + what_it_is(item) +
               ", the schema says object";
      const std::string p = check_object(item, {&field.members}, where, item_path + ".");
      if (!p.empty()) return p;
    } else if (!scalar_fits(field.value_type, item)) {
      return where + ": field '" + item_path + "' is " + what_it_is(item) + ", the schema says " +
             type_name(field.value_type);
    }
  }
  return "";
}

// Every key of `object` must be one of the fields of `schemas`, with the right type, and
// every required field must be there.
std::string check_object(const Json& object, const std::vector<const std::vector<Field>*>& schemas,
                         const std::string& where, const std::string& prefix) {
  for (const auto* fields : schemas) {
    for (const Field& f : *fields) {
      if (f.required && !object.contains(f.name))
        return where + ": required field '" + prefix + f.name + "' is missing";
    }
  }
  for (const auto& [key, value] : object.items()) {
    const Field* field = nullptr;
    for (const auto* fields : schemas) {
      for (const Field& f : *fields) {
        if (f.name == key) field = &f;
      }
    }
    if (field == nullptr) {
      return where + ": field '" + prefix + key +
             "' is not in the schema (src/log/event_schema.cpp)";
    }
    const std::string p = check_value(*field, value, where, prefix + key);
    if (!p.empty()) return p;
  }
  return "";
}

}  // namespace

const std::vector<Field>& common_fields() {
  static const std::vector<Field> fields{
      required("t", Type::kNumber, "seconds since the peer started (this incarnation of it)"),
      required("peer", Type::kString, "the peer's name (`name` in the config)"),
      required("event", Type::kString, "the kind of event, below"),
  };
  return fields;
}

const std::vector<Event>& events() {
  static const std::vector<Event> all = build_events();
  return all;
}

const Event* find_event(std::string_view name) {
  for (const Event& e : events()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string type_text(const Field& field) {
  std::string text = type_name(field.type);
  if (field.type == Type::kMap) {
    text += ": ";
    text += field.key_is;
    text += " → ";
    text += field.members.empty() ? type_name(field.value_type) : "object";
  }
  if (!field.required) text += ", optional";
  return text;
}

std::string problem(const JsonObject& event) {
  const Json& e = event.json();
  const auto name = e.find("event");
  if (name == e.end() || !name->is_string())
    return "an event without a string 'event' field: " + event.str().substr(0, 200);
  const Event* spec = find_event(name->get<std::string>());
  const std::string where = "event '" + name->get<std::string>() + "'";
  if (spec == nullptr) return where + " is not in the schema (src/log/event_schema.cpp)";
  return check_object(e, {&common_fields(), &spec->fields}, where, "");
}

}  // namespace hearsay::log_schema
