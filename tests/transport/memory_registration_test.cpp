// Memory registration on every transport built: a buffer registered, sent from without a
// copy, released and registered again; what each transport says it did.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <numeric>

#include "hearsay/emulated.h"
#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "transport_harness.h"

using namespace hearsay;
using test::options_for;
using test::Pair;
using test::update_frame;

namespace {

bool is_fabric(const std::string& kind) { return kind.rfind("fabric", 0) == 0; }

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("memory registration: a registered buffer is sent from, released and registered again, on every transport") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    // 64 KiB: above fabric's direct-payload threshold, several of its messages otherwise.
    auto values = std::make_shared<std::vector<float>>(16384);
    std::iota(values->begin(), values->end(), 0.5f);
    const size_t bytes = values->size() * sizeof(float);

    MemoryRegistration reg = p.b.t->register_memory(values->data(), bytes, MemoryKind::kHost);
    CAPTURE(reg.note());
    CHECK(reg.data() == values->data());
    CHECK(reg.bytes() == bytes);
    CHECK(reg.kind() == MemoryKind::kHost);
    CHECK(reg.note().rfind(p.b.t->kind() + ": ", 0) == 0);
    // A descriptor exactly when the provider holds a registration.
    CHECK(reg.registered() == (reg.descriptor() != nullptr));
    if (is_fabric(kind)) {
      // The fabric transport says what the provider's domain asked for, and did that.
      CHECK(mentions(reg.note(), "mr_mode 0x"));
      CHECK(reg.registered() == mentions(reg.note(), "asks for FI_MR_LOCAL"));
    } else {
      CHECK_FALSE(reg.registered());
    }

    // Sent from the registered memory itself (the frame references it), arrives intact.
    SendStatus status{false, "never called"};
    std::mutex mu;
    p.b.t->send("a", update_frame(*values, 1, values), [&](const SendStatus& s) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
    });
    REQUIRE(p.a.wait_frames(1));
    {
      std::lock_guard<std::mutex> lock(p.a.mu);
      REQUIRE(p.a.got[0].second.payload.size() == bytes);
      CHECK(std::memcmp(p.a.got[0].second.payload.data(), values->data(), bytes) == 0);
    }
    REQUIRE(p.b.wait([&] {
      std::lock_guard<std::mutex> lock(mu);
      return status.ok;
    }));

    // Released: the handle lets go once, however often asked.
    reg.release();
    CHECK_FALSE(reg.registered());
    CHECK(reg.descriptor() == nullptr);
    reg.release();

    // The same memory registers again; a moved handle carries the registration along.
    MemoryRegistration again = p.b.t->register_memory(values->data(), bytes, MemoryKind::kHost);
    const bool was_registered = again.registered();
    MemoryRegistration moved = std::move(again);
    CHECK(moved.data() == values->data());
    CHECK(moved.registered() == was_registered);
    CHECK(again.data() == nullptr);
    CHECK_FALSE(again.registered());

    // No transport built here reaches a GPU's memory: said, not pretended.
    CHECK_THROWS_AS(p.b.t->register_memory(values->data(), bytes, MemoryKind::kDevice), InputError);
  }
}

TEST_CASE("memory registration: link emulation hands it to the transport it wraps") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    auto emulated = create_emulated_transport(create_transport(kind, options_for("a")), LinkModel{});
    emulated->listen(test::local_address(kind));
    std::vector<uint8_t> buffer(4096, 7);
    MemoryRegistration reg = emulated->register_memory(buffer.data(), buffer.size(), MemoryKind::kHost);
    // The inner transport's kind, not "emulated(...)": it is the one that registered.
    CHECK(reg.note().rfind(kind.substr(0, kind.find(':')), 0) == 0);
    CHECK(reg.data() == buffer.data());
    reg.release();
    emulated->close();
  }
}

TEST_CASE("memory registration (fabric): only between set-up and close, and a handle outliving close() is safe") {
  for (const auto& kind : available_transports()) {
    if (!is_fabric(kind)) continue;
    CAPTURE(kind);
    std::vector<uint8_t> buffer(4096, 1);
    auto t = create_transport(kind, options_for("a"));
    // The domain opens with listen() or connect().
    CHECK_THROWS_AS(t->register_memory(buffer.data(), buffer.size(), MemoryKind::kHost), InputError);
    t->listen(test::local_address(kind));
    MemoryRegistration reg = t->register_memory(buffer.data(), buffer.size(), MemoryKind::kHost);
    CHECK(reg.data() == buffer.data());
    t->close();
    CHECK_THROWS_AS(t->register_memory(buffer.data(), buffer.size(), MemoryKind::kHost), InputError);
    reg.release();  // the domain closed what was still registered; nothing left to undo
    CHECK_FALSE(reg.registered());
  }
}
