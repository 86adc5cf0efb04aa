// The admission handshake against the attacks docs/WIRE.md says it resists: reflection,
// relay, replay, impersonation. Sessions are driven by hand (the attacker sees and forges
// every frame), so each attack is exact and needs no sockets.
#include <doctest/doctest.h>

#include <map>

#include "hearsay/transport.h"
#include "../../src/transport/session.h"
#include "transport_harness.h"

using namespace hearsay;
using test::options_for;

namespace {

// One side of a connection as the attacker sees it: the Session, the frames it sent
// (decoded), whether it admitted and why it refused.
struct End {
  TransportOptions options;  // the Session keeps a reference
  std::vector<wire::Envelope> out;
  std::string admitted_as, refused;
  std::unique_ptr<Session> s;

  End(const TransportOptions& o, const std::string& dial_peer) : options(o) {
    s = std::make_unique<Session>(
        options, "attacker", dial_peer,
        Session::Hooks{[this](OutFrame f) {
                         FrameDecoder d;
                         const std::string bytes = flatten(f);
                         d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                [&](InFrame&& in) { out.push_back(*in.envelope); });
                       },
                       [this](const std::string& r) { refused = r; }, [this](const std::string& p) { admitted_as = p; },
                       [](InFrame&&) {}, [](const std::string&) {}});
    s->start();
  }
  // The first Hello it sent with a nonce (phase 1) or a proof (phase 2).
  std::string nonce() const {
    for (const auto& e : out) {
      if (e.hello().has_nonce()) return e.hello().nonce();
    }
    return {};
  }
  std::string proof() const {
    for (const auto& e : out) {
      if (e.hello().has_proof()) return e.hello().proof();
    }
    return {};
  }
  void receive(const wire::Envelope& e) {
    const std::string bytes = flatten(make_frame(e));
    FrameDecoder d;
    d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& f) { s->on_frame(std::move(f)); });
  }
  void hello(const std::string& name, const std::string& nonce, const std::string& cluster = "test-cluster") {
    wire::Envelope e;
    auto* h = e.mutable_hello();
    h->set_peer_id(name);
    h->set_cluster_id(cluster);
    h->set_protocol_version(kProtocolVersion);
    h->set_nonce(nonce);
    receive(e);
  }
  void proof(const std::string& name, const std::string& p) {
    wire::Envelope e;
    e.mutable_hello()->set_peer_id(name);
    e.mutable_hello()->set_proof(p);
    receive(e);
  }
};

TransportOptions member(const std::string& name) {
  auto o = options_for(name);
  o.cluster_peers = {"a", "b", "c"};
  return o;
}

const std::string kAttackerNonce(32, 'z');

// Hands each side's frames to the other until both have said all they will (two rounds:
// the Hellos, then the proofs); `dialler` dialled `listener`.
void handshake(End& listener, End& dialler) {
  for (int i = 0; i < 2; ++i) {
    for (auto& e : dialler.out) listener.receive(e);
    dialler.out.clear();
    for (auto& e : listener.out) dialler.receive(e);
    listener.out.clear();
  }
}

}  // namespace

TEST_CASE("admission: honest dialler and listener admit each other") {
  End a(member("a"), ""), b(member("b"), "a");  // b dials a
  handshake(a, b);
  CHECK(a.admitted_as == "b");
  CHECK(b.admitted_as == "a");
}

TEST_CASE("admission: a peer's own proof reflected back to it is refused (under its name or another)") {
  for (const std::string claimed : {"a", "b"}) {
    CAPTURE(claimed);
    // The attacker opens two connections to a and plays a's nonce from the first into the
    // second, so a signs something about its own nonce; then hands that back on the first.
    End first(member("a"), ""), second(member("a"), "");
    first.hello(claimed, kAttackerNonce);
    second.hello(claimed, first.nonce());
    for (const std::string& reflected : {second.proof(), first.proof()}) {
      if (!first.refused.empty()) break;
      first.proof(claimed, reflected);
    }
    CHECK(first.admitted_as.empty());
    CHECK_FALSE(first.refused.empty());
    if (claimed == "a") CHECK(first.refused.find("own name") != std::string::npos);
    if (claimed == "b") CHECK(first.refused.find("wrong proof") != std::string::npos);
  }
}

TEST_CASE("admission: a proof relayed from the real peer is refused") {
  // The attacker claims to be b towards a, and has the real b (a listener, as every peer
  // is to those it does not dial) sign a's nonce, claiming to be a towards b.
  End a(member("a"), "");
  End b(member("b"), "");
  a.hello("b", kAttackerNonce);
  b.hello("a", a.nonce());
  REQUIRE_FALSE(b.proof().empty());
  a.proof("b", b.proof());
  CHECK(a.admitted_as.empty());
  CHECK(a.refused.find("wrong proof") != std::string::npos);
  // Nor does relaying the nonces the other way round help: b dials (as the honest peer
  // does), the attacker stands where a should be and forwards to the real a.
  End a2(member("a"), "");
  End b_dialling(member("b"), "c");  // b dialled c's address, which the attacker holds
  a2.hello("b", b_dialling.nonce());
  b_dialling.hello("c", a2.nonce());
  a2.proof("b", b_dialling.proof());
  CHECK(a2.admitted_as.empty());
}

TEST_CASE("admission: a recorded handshake replayed on a new connection is refused") {
  End a(member("a"), ""), b(member("b"), "a");
  for (auto& e : b.out) a.receive(e);
  for (auto& e : a.out) b.receive(e);
  const std::string b_nonce = b.nonce(), b_proof = b.proof();
  REQUIRE_FALSE(b_proof.empty());
  a.proof("b", b_proof);
  REQUIRE(a.admitted_as == "b");
  // Everything b sent, replayed byte for byte to a fresh connection of a.
  End again(member("a"), "");
  again.hello("b", b_nonce);
  again.proof("b", b_proof);
  CHECK(again.admitted_as.empty());
  CHECK(again.refused.find("wrong proof") != std::string::npos);
}

TEST_CASE("admission: names outside the cluster, a dialled peer under another name and a mirrored nonce are refused") {
  End a(member("a"), "");
  a.hello("mallory", kAttackerNonce);
  CHECK(a.refused.find("'mallory' is not a peer of cluster 'test-cluster'") != std::string::npos);
  CHECK(a.proof().empty());  // refused before it signed anything

  End dialler(member("b"), "a");
  dialler.hello("c", kAttackerNonce);
  CHECK(dialler.refused.find("dialled peer 'a' but it says it is 'c'") != std::string::npos);

  End mirror(member("a"), "");
  mirror.hello("b", mirror.nonce());
  CHECK(mirror.refused.find("own nonce") != std::string::npos);
  CHECK(mirror.proof().empty());
}

TEST_CASE("admission: the proof binds every field of the transcript and the prover's role") {
  AdmissionTranscript t{"c", "dialler", "listener", std::string(32, '1'), std::string(32, '2')};
  const std::string base = admission_proof("secret-of-16-bytes", t, Role::kDialler);
  CHECK(base != admission_proof("secret-of-16-bytes", t, Role::kListener));
  CHECK(base != admission_proof("secret-of-16-byteS", t, Role::kDialler));
  std::vector<AdmissionTranscript> changed(5, t);
  changed[0].cluster = "d";
  std::swap(changed[1].dialler, changed[1].listener);
  changed[2].dialler_nonce[31] = '3';
  changed[3].listener_nonce[0] = '3';
  std::swap(changed[4].dialler_nonce, changed[4].listener_nonce);
  for (const auto& c : changed) CHECK(admission_proof("secret-of-16-bytes", c, Role::kDialler) != base);
}

TEST_CASE("admission: what a stranger names itself, its cluster or its reason reaches the log cut short and printable") {
  // A 4,000-byte name, a cluster id with a terminal escape, a Bye's reason of 10,000 bytes:
  // each is refused, and the refusal quotes at most 64 bytes of it, escapes replaced.
  const std::string long_name(4000, 'm');
  End a(member("a"), "");
  a.hello(long_name, kAttackerNonce);
  CHECK(a.refused.find("a peer id that is no peer's name") != std::string::npos);
  CHECK(a.refused.find("(4000 bytes)") != std::string::npos);
  CHECK(a.refused.size() < 200);
  CHECK(a.proof().empty());

  // Names the config would refuse are refused on the wire too, even without a member list.
  for (const std::string& bad : std::vector<std::string>{"../../etc/passwd", "a b", ".hidden", std::string("x\x1b[2J", 5)}) {
    CAPTURE(bad);
    auto open = options_for("a");
    open.cluster_peers.clear();
    End listener(open, "");
    listener.hello(bad, kAttackerNonce);
    CHECK(listener.refused.find("no peer's name") != std::string::npos);
    CHECK(listener.refused.find('\x1b') == std::string::npos);
  }

  End c(member("a"), "");
  c.hello("b", kAttackerNonce, "other\x1b]0;pwned\x07" + std::string(500, 'c'));
  CHECK(c.refused.find("wrong cluster 'other?]0;pwned?") != std::string::npos);
  CHECK(c.refused.find("(515 bytes)") != std::string::npos);
  CHECK(c.refused.find('\x07') == std::string::npos);

  // After admission, a Bye's reason is the other side's text too.
  End x(member("a"), ""), y(member("b"), "a");
  handshake(x, y);
  REQUIRE(x.admitted_as == "b");
  wire::Envelope bye;
  bye.mutable_bye()->set_reason(std::string(10000, 'r'));
  x.receive(bye);
  CHECK(x.refused.find("bye: rrrr") != std::string::npos);
  CHECK(x.refused.find("(10000 bytes)") != std::string::npos);
  CHECK(x.refused.size() < 200);
}

TEST_CASE("admission: a probe before admission closes the connection, after it, it is answered with a reply") {
  End listener(member("a"), "");
  wire::Envelope probe;
  probe.mutable_probe()->set_seq(1);
  listener.receive(probe);
  CHECK(listener.refused == "admission: frame before admission");

  End a(member("a"), ""), b(member("b"), "a");
  handshake(a, b);
  REQUIRE(a.admitted_as == "b");
  a.out.clear();
  a.receive(probe);
  REQUIRE(a.out.size() == 1);
  CHECK(a.out[0].probe().is_reply());
  CHECK(a.out[0].probe().seq() == 1);
  CHECK(a.refused.empty());
}

TEST_CASE("session: replies a neighbour never reads are bounded and then close its connection, and replies read free their place") {
  // A Session whose replies sit in its transport's queue, unread, until `held` lets go.
  std::vector<OutFrame> held;
  std::string refused;
  TransportOptions options = member("a");
  Session s(options, "b-address", "", Session::Hooks{[&](OutFrame f) { held.push_back(std::move(f)); },
                                                    [&](const std::string& r) { refused = r; }, [](const std::string&) {},
                                                    [](InFrame&&) {}, [](const std::string&) {}});
  // Admit b by hand: its nonce, then its proof over the transcript.
  s.start();
  const std::string a_nonce = [&] {
    FrameDecoder d;
    std::string nonce;
    const std::string bytes = flatten(held.back());
    d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& in) { nonce = in.envelope->hello().nonce(); });
    return nonce;
  }();
  held.clear();
  auto feed = [&](const wire::Envelope& e) {
    const std::string bytes = flatten(make_frame(e));
    FrameDecoder d;
    d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& f) { s.on_frame(std::move(f)); });
  };
  wire::Envelope hello;
  hello.mutable_hello()->set_peer_id("b");
  hello.mutable_hello()->set_cluster_id("test-cluster");
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_nonce(kAttackerNonce);
  feed(hello);
  AdmissionTranscript t{"test-cluster", "b", "a", kAttackerNonce, a_nonce};
  wire::Envelope proof;
  proof.mutable_hello()->set_peer_id("b");
  proof.mutable_hello()->set_proof(admission_proof(options.secret, t, Role::kDialler));
  feed(proof);
  REQUIRE(s.admitted());
  held.clear();

  wire::Envelope probe, heartbeat;
  probe.mutable_probe()->set_seq(7);
  heartbeat.mutable_heartbeat()->set_seq(1);
  // Far more requests than the bound: replies stop at it, and nothing is closed until
  // the refusals in a row reach theirs.
  for (uint32_t i = 0; i < 2 * Session::kMaxRepliesQueued; ++i) feed(i % 2 ? probe : heartbeat);
  CHECK(held.size() == Session::kMaxRepliesQueued);
  CHECK(s.replies_queued() == Session::kMaxRepliesQueued);
  CHECK(s.replies_refused() == Session::kMaxRepliesQueued);
  CHECK(refused.empty());
  // The neighbour reads half: as many places come free, and as many replies are sent.
  held.erase(held.begin(), held.begin() + Session::kMaxRepliesQueued / 2);
  CHECK(s.replies_queued() == Session::kMaxRepliesQueued / 2);
  for (uint32_t i = 0; i < Session::kMaxRepliesQueued / 2; ++i) feed(probe);
  CHECK(held.size() == Session::kMaxRepliesQueued);
  CHECK(refused.empty());
  // Then it reads nothing more: the refusals in a row close the connection, saying why.
  for (uint64_t i = 0; i < Session::kMaxRepliesRefused && refused.empty(); ++i) feed(probe);
  CHECK(held.size() == Session::kMaxRepliesQueued);
  CHECK(refused.rfind("backlog: 'b' sent 4096 requests while 256 replies to it waited unread", 0) == 0);
  CHECK(s.rejected());
  // What was queued is released with the connection's queue: the count follows the frames.
  held.clear();
  CHECK(s.replies_queued() == 0);
}
