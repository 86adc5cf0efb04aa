// libFuzzer target: whole sessions, as a hostile (or an honest) peer would run them. The
// input is a script: the session's role and cluster, then a sequence of frames built from
// it (phase-1 Hellos with fuzzed names, nonces, versions and clusters; proofs, fuzzed or
// correct for the transcript so that the fuzzer gets past admission; heartbeats; updates
// with fuzzed headers and payloads; credits; byes; empty envelopes; corrupted frames; raw
// garbage), cut into chunks and fed through a FrameDecoder into a Session with real
// hooks. A delivered update then takes the path a peer's engine runs: the tensor length
// against the model's, check_update, and Inbox::add_segment with a Mixer.
//
// Invariants, each a __builtin_trap() when broken: nothing is delivered or dropped before
// admission or after a reject; admission happens once, only on the correct proof of an
// admissible name; the session's own proof is correct and sent once, only after a valid
// phase-1 Hello; heartbeats only once admitted; the decoder, once failed, takes nothing
// more; every delivered update passes the checks the session claims to have made; what
// the inbox hands out lies within the tensor and is finite; the inbox's memory stays
// within its stated bound.
//
// Built with clang (-fsanitize=fuzzer,address,undefined) when clang is present; ctest
// runs it for a bounded number of inputs. Run longer by hand:
//   build/bin/hearsay-fuzz-session -max_total_time=600 -rss_limit_mb=512 -malloc_limit_mb=256
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hearsay/wire.pb.h"
#include "../../src/peer/mailboxes.h"
#include "../../src/peer/update_guard.h"
#include "../../src/transport/session.h"
#include "hearsay/mixer.h"
#include "hearsay/wire.h"

namespace {

using namespace hearsay;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr uint64_t kModel = 256;  // the receiver's model, in elements
constexpr size_t kMaxOps = 64;
constexpr uint64_t kAdmittedPayloadBytes = 1 << 20;
const char* const kSecret = "fuzz-cluster-secret-0123456789abcdef";
const char* const kNames[] = {"a", "b", "me", "", "stranger"};

// What the session last sent, decoded back from its bytes.
wire::Envelope decode_sent(const OutFrame& f) {
  const std::string bytes = flatten(f);
  FrameDecoder d;
  wire::Envelope out;
  int frames = 0;
  const FrameError err = d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& in) {
    out = std::move(*in.envelope);
    ++frames;
  });
  require(err == FrameError::kNone && frames == 1 && d.pending() == 0);
  return out;
}

class Harness {
 public:
  Harness(bool dialler, bool closed_cluster) {
    options_.peer_id = "me";
    options_.cluster_id = "c";
    options_.secret = kSecret;
    if (closed_cluster) options_.cluster_peers = {"me", "a", "b"};
    dial_peer_ = dialler ? "a" : "";
    session_ = std::make_unique<Session>(
        options_, "fuzz-address", dial_peer_,
        Session::Hooks{[this](OutFrame f) { on_send(f); }, [this](const std::string&) { on_reject(); },
                       [this](const std::string& peer) { on_admitted(peer); },
                       [this](InFrame&& f) { on_deliver(std::move(f)); }, [this](const std::string&) { on_drop(); }});
    session_->start();
    require(hellos_sent_ == 1 && my_nonce_.size() == 32);
  }

  const std::string& my_nonce() const { return my_nonce_; }

  // The transcript as the script's side sees it, for a remote of `name` with `nonce`.
  AdmissionTranscript transcript(const std::string& name, const std::string& nonce) const {
    AdmissionTranscript t;
    t.cluster = options_.cluster_id;
    const bool dialled = !dial_peer_.empty();
    t.dialler = dialled ? options_.peer_id : name;
    t.listener = dialled ? name : options_.peer_id;
    t.dialler_nonce = dialled ? my_nonce_ : nonce;
    t.listener_nonce = dialled ? nonce : my_nonce_;
    return t;
  }
  Role my_role() const { return dial_peer_.empty() ? Role::kListener : Role::kDialler; }
  Role their_role() const { return dial_peer_.empty() ? Role::kDialler : Role::kListener; }

  // The name and nonce of the last phase-1 Hello the script sent (what a correct proof
  // is computed over when the session has not taken one yet).
  std::string hello_name, hello_nonce;

  void feed(const std::string& bytes, size_t chunk) {
    for (size_t i = 0; i < bytes.size(); i += chunk) {
      const size_t n = std::min(chunk, bytes.size() - i);
      int frames = 0;
      const FrameError err = decoder_.feed(reinterpret_cast<const uint8_t*>(bytes.data()) + i, n, [&](InFrame&& f) {
        ++frames;
        require(!decoder_failed_);
        on_frame(std::move(f));
      });
      if (decoder_failed_) require(err != FrameError::kNone && frames == 0);
      if (err != FrameError::kNone) decoder_failed_ = true;
    }
  }

  void tick(double seconds_ahead) {
    session_->tick(std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds_ahead)));
  }

  // What the step loop does with the inbox: takes the asynchronous messages, and the
  // synchronous ones of a round.
  void drain(uint64_t round, uint32_t phase, bool async) {
    if (async) {
      for (const auto& m : inbox_.take_async()) check_message(m);
    } else {
      std::atomic<bool> stop{false};
      std::string refused;
      if (auto m = inbox_.wait_sync(0, round, phase, 0.0, stop, &refused)) {
        require(m->synchronous && m->round == round && m->phase == phase);
        check_message(*m);
      }
      inbox_.take_senders_of(round, phase);
    }
  }

 private:
  // The inbox's bound on what it holds from one sender (src/peer/mailboxes.h): 8
  // unfinished messages (capacity at most twice the tensor), one asynchronous message per
  // fold slot (4 kinds, with or without a reply requested), kDeltas model deltas,
  // kSyncMessages + 1 synchronous.
  static constexpr size_t kInboxBound =
      (8 * 2 + 8 + Inbox::kDeltas + Inbox::kSyncMessages + 1) * kModel * sizeof(float);

  void check_message(const GossipEngine::Message& m) {
    require(m.total == kModel && m.data.size() <= m.total && m.offset <= m.total - m.data.size());
    require(find_non_finite(m.data.data(), m.data.size()).empty() && std::isfinite(m.push_sum_weight));
  }

  void on_frame(InFrame&& f) {
    current_ = *f.envelope;
    session_->on_frame(std::move(f));
  }

  void on_send(const OutFrame& f) {
    require(!rejected_);
    const wire::Envelope e = decode_sent(f);
    if (e.has_hello() && e.hello().has_nonce()) {
      require(hellos_sent_++ == 0 && e.hello().peer_id() == options_.peer_id && e.hello().cluster_id() == options_.cluster_id &&
              e.hello().protocol_version() == kProtocolVersion && !e.hello().has_proof());
      my_nonce_ = e.hello().nonce();
      return;
    }
    if (e.has_hello() && e.hello().has_proof()) {
      // Proves itself once, only in answer to an admissible phase-1 Hello, over the
      // transcript with that Hello's name and nonce and its own role.
      require(proofs_sent_++ == 0 && !admitted_ && current_.has_hello() && current_.hello().has_nonce());
      const auto& h = current_.hello();
      require(h.protocol_version() == kProtocolVersion && h.cluster_id() == options_.cluster_id && h.nonce().size() == 32 &&
              h.nonce() != my_nonce_ && admissible(h.peer_id()));
      taken_name_ = h.peer_id();
      taken_nonce_ = h.nonce();
      require(e.hello().proof() == admission_proof(options_.secret, transcript(taken_name_, taken_nonce_), my_role()));
      return;
    }
    if (e.has_heartbeat()) {
      require(admitted_);
      if (e.heartbeat().is_reply()) require(current_.has_heartbeat() && !current_.heartbeat().is_reply());
      return;
    }
    require(false);  // nothing else is the session's to send
  }

  bool admissible(const std::string& name) const {
    if (name.empty() || name == options_.peer_id) return false;
    if (!dial_peer_.empty() && name != dial_peer_) return false;
    const auto& m = options_.cluster_peers;
    return m.empty() || std::find(m.begin(), m.end(), name) != m.end();
  }

  void on_reject() {
    require(!rejected_);
    rejected_ = true;
  }

  void on_admitted(const std::string& peer) {
    require(!admitted_ && !rejected_ && proofs_sent_ == 1 && peer == taken_name_ && admissible(peer));
    require(current_.has_hello() && current_.hello().has_proof() && !current_.hello().has_nonce());
    require(current_.hello().proof() == admission_proof(options_.secret, transcript(taken_name_, taken_nonce_), their_role()));
    admitted_ = true;
    // As a connection does once its peer is admitted, with a smaller payload limit: the
    // decoder reserves (address space for) each checked payload whole, up to 1 GiB by
    // default, which -malloc_limit_mb would count though no page of it is touched.
    decoder_.set_limits(WireLimits{options_.limits.max_header_bytes, kAdmittedPayloadBytes});
  }

  void on_drop() {
    require(admitted_ && !rejected_ && current_.has_update());
  }

  void on_deliver(InFrame&& f) {
    require(admitted_ && !rejected_ && (f.envelope->has_update() || f.envelope->has_credit()));
    if (!f.envelope->has_update()) return;
    const wire::Update& u = f.envelope->update();
    require(check_update(u, f.payload.size()).empty());
    // The engine's side (GossipEngine::on_frame): another model's tensor is dropped.
    if (u.tensor_length() != kModel) return;
    require(check_update(u, f.payload.size(), kModel).empty());
    inbox_.add_segment(0, u, f.payload.data(), f.payload.size());
    require(inbox_.buffered_bytes() <= kInboxBound);
  }

  TransportOptions options_;
  std::string dial_peer_;
  std::unique_ptr<Session> session_;
  FrameDecoder decoder_{kHandshakeLimits};
  bool decoder_failed_ = false;
  wire::Envelope current_;  // the frame the session is handling
  std::string my_nonce_;
  std::string taken_name_, taken_nonce_;  // the phase-1 Hello the session answered
  int hellos_sent_ = 0, proofs_sent_ = 0;
  bool admitted_ = false, rejected_ = false;
  Mixer mixer_{MixerSpec{}};
  Inbox inbox_{mixer_};
};

std::string pick_name(FuzzedDataProvider& in) {
  const size_t i = in.ConsumeIntegralInRange<size_t>(0, std::size(kNames));
  return i < std::size(kNames) ? kNames[i] : in.ConsumeRandomLengthString(16);
}

void phase1_hello(FuzzedDataProvider& in, Harness& h, wire::Envelope& e) {
  auto* hello = e.mutable_hello();
  const std::string name = pick_name(in);
  hello->set_peer_id(name);
  if (in.ConsumeBool()) hello->set_site(in.ConsumeRandomLengthString(16));
  hello->set_cluster_id(in.ConsumeIntegral<uint8_t>() < 240 ? "c" : in.ConsumeRandomLengthString(8));
  hello->set_protocol_version(in.ConsumeIntegral<uint8_t>() < 240 ? kProtocolVersion : in.ConsumeIntegral<uint32_t>());
  std::string nonce;
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:  // fresh
    case 1:
      nonce = in.ConsumeBytesAsString(32);
      nonce.resize(32, '\x5a');
      break;
    case 2:  // a mirror of the session's own
      nonce = h.my_nonce();
      break;
    default:  // any length
      nonce = in.ConsumeRandomLengthString(64);
  }
  hello->set_nonce(nonce);
  if (in.ConsumeIntegral<uint8_t>() >= 250) hello->set_proof(in.ConsumeRandomLengthString(40));
  h.hello_name = name;
  h.hello_nonce = nonce;
}

void proof(FuzzedDataProvider& in, Harness& h, wire::Envelope& e) {
  auto* hello = e.mutable_hello();
  hello->set_peer_id(in.ConsumeBool() ? h.hello_name : pick_name(in));
  const AdmissionTranscript t = h.transcript(h.hello_name, h.hello_nonce);
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:  // correct
    case 1:
      hello->set_proof(admission_proof(kSecret, t, h.their_role()));
      break;
    case 2:  // the session's own role: a reflected proof
      hello->set_proof(admission_proof(kSecret, t, h.my_role()));
      break;
    case 3:  // another secret
      hello->set_proof(admission_proof(std::string(kSecret) + "x", t, h.their_role()));
      break;
    default:
      hello->set_proof(in.ConsumeRandomLengthString(40));
  }
}

// An update: mostly plausible headers (this model's length, a segment inside it), each
// field sometimes anything; payload fp32 values (some non-finite) or any bytes.
void update(FuzzedDataProvider& in, wire::Envelope& e, std::vector<uint8_t>& payload) {
  auto* u = e.mutable_update();
  u->set_sender(pick_name(in));
  u->set_clock(in.ConsumeIntegralInRange<uint64_t>(0, 16));
  u->set_step(in.ConsumeIntegral<uint16_t>());
  u->set_samples_seen(in.ConsumeIntegral<uint32_t>());
  u->set_kind(static_cast<wire::PayloadKind>(in.ConsumeIntegralInRange(0, 3)));
  const bool plausible = in.ConsumeIntegral<uint8_t>() < 224;
  const uint64_t total = plausible ? kModel : in.ConsumeIntegral<uint64_t>();
  u->set_tensor_length(total);
  // Plausible: half of them the whole tensor in one segment, as peers mostly send it.
  const bool whole = plausible && in.ConsumeBool();
  const uint64_t length = whole ? kModel : plausible ? in.ConsumeIntegralInRange<uint64_t>(0, kModel) : in.ConsumeIntegral<uint64_t>();
  const uint64_t offset = whole ? 0 : plausible ? in.ConsumeIntegralInRange<uint64_t>(0, kModel - length) : in.ConsumeIntegral<uint64_t>();
  u->set_segment_length(length);
  u->set_segment_offset(offset);
  u->set_update_id(in.ConsumeIntegralInRange<uint64_t>(0, 12));
  // Mostly one segment (index 0 of 1), as small tensors travel.
  u->set_segment_count(in.ConsumeBool() ? 1 : in.ConsumeIntegralInRange<uint32_t>(0, 4));
  u->set_segment_index(in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<uint32_t>(0, 4));
  if (in.ConsumeBool()) u->set_push_sum_weight(in.ConsumeFloatingPoint<double>());
  if (in.ConsumeBool()) {
    u->set_synchronous(true);
    u->set_round(in.ConsumeBool() ? ~uint64_t{0} : in.ConsumeIntegralInRange<uint64_t>(0, 8));
    u->set_phase(in.ConsumeIntegralInRange<uint32_t>(0, 2));
  }
  u->set_reply_requested(in.ConsumeBool());
  if (in.ConsumeBool()) u->set_mix_share(in.ConsumeFloatingPoint<double>());
  auto* codec = u->mutable_codec();
  const uint32_t codec_id = in.ConsumeIntegral<uint8_t>() < 128 ? 0 : in.ConsumeIntegralInRange<uint32_t>(0, kCodecCount);
  codec->set_codec_id(codec_id);
  if (in.ConsumeIntegral<uint8_t>() >= 240) codec->set_codec_version(in.ConsumeIntegral<uint32_t>());
  const int values = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < values; ++i) codec->add_values(in.ConsumeFloatingPoint<double>());
  codec->set_seed(in.ConsumeIntegral<uint64_t>());
  if (codec_id == 0 && length <= kModel && in.ConsumeIntegral<uint8_t>() < 224) {
    std::vector<float> v(length);
    for (auto& x : v) x = in.ConsumeFloatingPoint<float>();
    if (!v.empty() && in.ConsumeIntegral<uint8_t>() >= 224) {
      v[in.ConsumeIntegralInRange<size_t>(0, v.size() - 1)] = in.ConsumeBool() ? NAN : INFINITY;
    }
    payload.resize(v.size() * sizeof(float));
    if (!v.empty()) std::memcpy(payload.data(), v.data(), payload.size());
  } else {
    payload = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 4 * kModel + 64));
  }
}

// Frame bytes, sometimes corrupted on the way (a flipped byte, a truncation).
std::string damage(FuzzedDataProvider& in, std::string bytes) {
  const uint8_t how = in.ConsumeIntegral<uint8_t>();
  if (how >= 248 && !bytes.empty()) {
    bytes[in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1)] ^= static_cast<char>(1 + in.ConsumeIntegral<uint8_t>() % 255);
  } else if (how >= 244 && !bytes.empty()) {
    bytes.resize(in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1));
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Fuzzed names are rarely UTF-8; protobuf would log each one it serializes or parses.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint8_t setup = in.ConsumeIntegral<uint8_t>();
  const size_t chunk = 1 + in.ConsumeIntegralInRange<size_t>(0, 4096) % (setup & 0x80 ? 4096 : 61);
  Harness h((setup & 1) != 0, (setup & 2) != 0);
  for (size_t op = 0; op < kMaxOps && in.remaining_bytes() > 0; ++op) {
    wire::Envelope e;
    std::vector<uint8_t> payload;
    switch (in.ConsumeIntegralInRange(0, 11)) {
      case 0:
        phase1_hello(in, h, e);
        break;
      case 1:
        proof(in, h, e);
        break;
      case 2:  // a correct exchange at once: the fuzzer need not find it
        phase1_hello(in, h, e);
        h.feed(flatten(make_frame(e)), chunk);
        e.Clear();
        proof(in, h, e);
        break;
      case 3: {
        auto* hb = e.mutable_heartbeat();
        hb->set_seq(in.ConsumeIntegral<uint64_t>());
        hb->set_send_time_ns(in.ConsumeIntegral<uint64_t>());
        hb->set_is_reply(in.ConsumeBool());
        break;
      }
      case 4:
      case 5:
      case 6:
        update(in, e, payload);
        break;
      case 7:
        e.mutable_credit()->set_credits(in.ConsumeIntegral<uint64_t>());
        e.mutable_credit()->set_acked_update_id(in.ConsumeIntegral<uint64_t>());
        break;
      case 8:
        if (in.ConsumeBool()) {
          e.mutable_bye()->set_reason(in.ConsumeRandomLengthString(32));
        }  // else an envelope with no body
        break;
      case 9:  // raw garbage
        h.feed(in.ConsumeRandomLengthString(256), chunk);
        continue;
      case 10:
        h.tick(in.ConsumeFloatingPointInRange<double>(0, 30));
        continue;
      default:
        h.drain(in.ConsumeIntegralInRange<uint64_t>(0, 8), in.ConsumeIntegralInRange<uint32_t>(0, 2), in.ConsumeBool());
        continue;
    }
    h.feed(damage(in, flatten(make_frame(e, payload.data(), payload.size()))), chunk);
  }
  h.drain(0, 0, true);
  return 0;
}
