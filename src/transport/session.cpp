#include "session.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>

#include "hearsay/error.h"
#include "hearsay/wire.h"

namespace hearsay {
namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

constexpr size_t kNonceBytes = 32;

}  // namespace

std::string admission_proof(const std::string& secret, const AdmissionTranscript& t, Role prover) {
  // Length-prefixed fields, so no two different transcripts sign the same bytes. Both
  // nonces make a proof good for this connection only (no replay); both names and the
  // prover's role make it good for this direction only (no reflection, no relay).
  const std::string version = std::to_string(kProtocolVersion);
  const std::string role = prover == Role::kDialler ? "dialler" : "listener";
  std::string msg = "hearsay-admission-v2";
  for (const std::string* f : {&version, &t.cluster, &t.dialler, &t.listener, &t.dialler_nonce, &t.listener_nonce, &role}) {
    const uint32_t n = static_cast<uint32_t>(f->size());
    msg.append(reinterpret_cast<const char*>(&n), 4);
    msg += *f;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HEARSAY_CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                     reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) != nullptr,
                "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string random_nonce() {
  std::string n(kNonceBytes, '\0');
  HEARSAY_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), kNonceBytes) == 1, "RAND_bytes failed");
  return n;
}

Session::Session(const TransportOptions& options, std::string remote_address, std::string dial_peer, Hooks hooks)
    : options_(options), remote_address_(std::move(remote_address)), dial_peer_(std::move(dial_peer)), hooks_(std::move(hooks)),
      started_(std::chrono::steady_clock::now()), last_heartbeat_(started_), last_heard_(started_) {}

void Session::reject(const std::string& reason) {
  rejected_ = true;
  hooks_.reject(reason);
}

void Session::reply(const wire::Envelope& e) {
  if (replies_queued_->load() >= kMaxRepliesQueued) {
    ++replies_refused_;
    if (++refused_in_a_row_ >= kMaxRepliesRefused) {
      reject("backlog: '" + remote_id_ + "' sent " + std::to_string(refused_in_a_row_) + " requests while " +
             std::to_string(kMaxRepliesQueued) + " replies to it waited unread; closed");
    }
    return;
  }
  refused_in_a_row_ = 0;
  // The frame's payload owner doubles as its ticket: released when the transport lets go
  // of the frame, it gives the place in the queue back.
  replies_queued_->fetch_add(1);
  std::shared_ptr<const void> ticket(nullptr, [queued = replies_queued_](const void*) { queued->fetch_sub(1); });
  hooks_.send(make_frame(e, nullptr, 0, std::move(ticket)));
}

void Session::start() {
  nonce_ = random_nonce();
  wire::Envelope e;
  auto* h = e.mutable_hello();
  h->set_peer_id(options_.peer_id);
  h->set_site(options_.site);
  h->set_cluster_id(options_.cluster_id);
  h->set_protocol_version(kProtocolVersion);
  h->set_nonce(nonce_);
  hooks_.send(make_frame(e));
}

std::string Session::refuse_name(const std::string& name) const {
  if (name.empty()) return "admission: Hello without a peer id";
  // Checked first: every message below, and every log line after admission, names it.
  if (!is_peer_name(name)) return "admission: a peer id that is no peer's name ('" + wire_text(name) + "')";
  if (name == options_.peer_id) return "admission: a connection claims this peer's own name '" + name + "'";
  if (!dial_peer_.empty() && name != dial_peer_) {
    return "admission: dialled peer '" + dial_peer_ + "' but it says it is '" + name + "'";
  }
  const auto& members = options_.cluster_peers;
  if (!members.empty() && std::find(members.begin(), members.end(), name) == members.end()) {
    return "admission: '" + name + "' is not a peer of cluster '" + options_.cluster_id + "'";
  }
  return {};
}

AdmissionTranscript Session::transcript() const {
  AdmissionTranscript t;
  t.cluster = options_.cluster_id;
  const bool dialled = role() == Role::kDialler;
  t.dialler = dialled ? options_.peer_id : remote_id_;
  t.listener = dialled ? remote_id_ : options_.peer_id;
  t.dialler_nonce = dialled ? nonce_ : remote_nonce_;
  t.listener_nonce = dialled ? remote_nonce_ : nonce_;
  return t;
}

// Phase 1 carries each side's name and fresh nonce; a side proves itself (phase 2) only
// once it holds both nonces, and only over the whole transcript with its own role.
void Session::on_hello(const wire::Hello& h) {
  if (h.has_nonce()) {  // phase 1
    if (!remote_nonce_.empty()) return reject("admission: second phase-1 Hello");
    if (h.protocol_version() != kProtocolVersion) {
      return reject("admission: protocol version " + std::to_string(h.protocol_version()) +
                    " unsupported (this peer speaks " + std::to_string(kProtocolVersion) + ")");
    }
    if (h.cluster_id() != options_.cluster_id) return reject("admission: wrong cluster '" + wire_text(h.cluster_id()) + "'");
    if (const std::string why = refuse_name(h.peer_id()); !why.empty()) return reject(why);
    if (h.nonce().size() != kNonceBytes) return reject("admission: nonce of the wrong size");
    // Our own nonce handed back is a mirror, never a second party.
    if (h.nonce() == nonce_) return reject("admission: the other side sent this side's own nonce");
    remote_id_ = h.peer_id();
    remote_nonce_ = h.nonce();
    wire::Envelope e;
    auto* reply = e.mutable_hello();
    reply->set_peer_id(options_.peer_id);
    reply->set_proof(admission_proof(options_.secret, transcript(), role()));
    hooks_.send(make_frame(e));
    return;
  }
  if (h.has_proof()) {  // phase 2
    if (remote_nonce_.empty()) return reject("admission: proof before Hello");
    if (admitted_) return reject("admission: second proof");
    const Role theirs = role() == Role::kDialler ? Role::kListener : Role::kDialler;
    const std::string want = admission_proof(options_.secret, transcript(), theirs);
    if (h.proof().size() != want.size() || CRYPTO_memcmp(h.proof().data(), want.data(), want.size()) != 0) {
      return reject("admission: wrong proof (cluster secret differs)");
    }
    admitted_ = true;
    hooks_.admitted(remote_id_);
    return;
  }
  reject("admission: Hello with neither nonce nor proof");
}

void Session::on_frame(InFrame&& frame) {
  if (rejected_) return;
  last_heard_ = std::chrono::steady_clock::now();
  const auto& e = *frame.envelope;
  switch (e.body_case()) {
    case wire::Envelope::kHello:
      on_hello(e.hello());
      return;
    case wire::Envelope::kBye:
      if (!admitted_) return reject("admission: Bye before admission");
      displaced_ = e.bye().displaced();
      said_bye_ = true;
      return reject("bye: " + wire_text(e.bye().reason()) +
                    (displaced_ ? "; another process holds this peer's name there, so it is not redialled" : ""));
    case wire::Envelope::kHeartbeat: {
      if (!admitted_) return reject("admission: frame before admission");
      const auto& hb = e.heartbeat();
      if (hb.is_reply()) {
        const double sample = static_cast<double>(now_ns() - hb.send_time_ns()) * 1e-9;
        if (sample >= 0 && sample < 3600) rtt_s_ = rtt_s_ < 0 ? sample : 0.875 * rtt_s_ + 0.125 * sample;
      } else {
        wire::Envelope r;
        *r.mutable_heartbeat() = hb;
        r.mutable_heartbeat()->set_is_reply(true);
        reply(r);
      }
      return;
    }
    case wire::Envelope::kProbe: {
      if (!admitted_) return reject("admission: frame before admission");
      // A reply goes to the receiver (the check that sent the probe; training ignores it).
      if (e.probe().is_reply()) return hooks_.deliver(std::move(frame));
      wire::Envelope r;
      r.mutable_probe()->set_seq(e.probe().seq());
      r.mutable_probe()->set_is_reply(true);
      r.mutable_probe()->set_bytes(frame.payload.size());
      reply(r);
      return;
    }
    case wire::Envelope::kUpdate:
    case wire::Envelope::kCredit:
      if (!admitted_) return reject("admission: frame before admission");
      if (e.has_update()) {
        const std::string why = check_update(e.update(), frame.payload.size());
        // Frame boundaries are intact, so only this frame goes; the link stays up.
        if (!why.empty()) return hooks_.drop(std::string(frame_error_name(FrameError::kBadUpdate)) + ": " + why);
      }
      hooks_.deliver(std::move(frame));
      return;
    case wire::Envelope::BODY_NOT_SET:
      return reject(admitted_ ? "bad_protobuf: empty envelope" : "admission: frame before admission");
  }
}

void Session::tick(std::chrono::steady_clock::time_point now) {
  if (!admitted_ || rejected_) return;
  const double silent = std::chrono::duration<double>(now - last_heard_).count();
  if (options_.liveness_timeout_s > 0 && silent > options_.liveness_timeout_s) {
    return reject("liveness: silent for " + std::to_string(static_cast<int>(silent)) + " s");
  }
  if (options_.heartbeat_interval_s <= 0) return;
  if (std::chrono::duration<double>(now - last_heartbeat_).count() < options_.heartbeat_interval_s) return;
  last_heartbeat_ = now;
  wire::Envelope e;
  e.mutable_heartbeat()->set_seq(++heartbeat_seq_);
  e.mutable_heartbeat()->set_send_time_ns(now_ns());
  hooks_.send(make_frame(e));
}

OutFrame Session::bye(const std::string& reason, bool displaced) const {
  wire::Envelope e;
  e.mutable_bye()->set_reason(reason);
  if (displaced) e.mutable_bye()->set_displaced(true);
  return make_frame(e);
}

}  // namespace hearsay
