// The checkpoint file (src/peer/checkpoint_file.cpp) and its background writer
// (src/peer/checkpoint_writer.cpp): large state in chunks with a checksum each, a damaged
// chunk refused before anything is read, and a write that runs beside the steps.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/error.h"
#include "hearsay/wire.h"
#include "../../src/peer/checkpoint_writer.h"
#include "../../src/peer/live_snapshot.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::TempDir;

namespace {

constexpr size_t kChunk = 8u << 20;            // the writer's chunk
constexpr size_t kParams = 5'000'000;          // 20 MB: three chunks

CheckpointData sample_state() {
  CheckpointData d;
  d.message = std::make_shared<ckpt::Checkpoint>();
  d.message->set_peer("p");
  d.message->set_step(7);
  auto* link = d.message->add_links();
  link->set_peer("q");
  link->set_residual(std::string(1000, '\x01'));
  d.message->set_algorithm_state("the algorithm's own");
  d.params.resize(kParams);
  for (size_t i = 0; i < kParams; ++i) d.params[i] = static_cast<float>(i % 977) * 0.5f;
  d.optimizer.optimizer = "sgd";
  d.optimizer.steps = 7;
  d.optimizer.buffers["velocity"] = std::vector<float>(1000, 0.25f);
  return d;
}

// Where the params blob's chunk k (0-based) starts in the file (its CRC): after the header
// and the manifest, each chunk's bytes on a 4 KiB boundary of the file with its 4-byte CRC
// just before them (version 3).
size_t params_chunk_at(const std::string& bytes, size_t k) {
  uint64_t manifest = 0;
  std::memcpy(&manifest, bytes.data() + 8, 8);
  const size_t first_data = (32 + manifest + 4 + 4095) / 4096 * 4096;
  return first_data - 4 + k * (kChunk + 4096);
}

// The file at `path` holds want's parameters and velocity, bit for bit.
void check_holds(const std::string& path, const CheckpointData& want) {
  const auto r = CheckpointReader::open(path, 1u << 30);
  REQUIRE(r.has_value());
  std::vector<float> params(kParams);
  r->read_blob("params", params.data(), 4 * kParams);
  CHECK(params == want.params);
  const ckpt::Checkpoint c = r->read_all({"params"});
  REQUIRE(c.optimizer_buffers_size() == 1);
  CHECK(c.optimizer_buffers(0).name() == "velocity");
  std::vector<float> velocity(1000);
  std::memcpy(velocity.data(), c.optimizer_buffers(0).values().data(), 4000);
  CHECK(velocity == want.optimizer.buffers.at("velocity"));
}

}  // namespace

TEST_CASE("checkpoint file: large state goes in chunks with a checksum each and comes back bit for bit, and a flipped byte "
          "in any chunk or a cut inside one is refused naming the blob and chunk") {
  TempDir dir;
  const std::string path = dir.file("p.ckpt");
  const CheckpointData want = [] {
    CheckpointData d = sample_state();
    d.message = std::make_shared<ckpt::Checkpoint>(*d.message);
    return d;
  }();
  CheckpointData d = sample_state();
  const uint64_t written = write_checkpoint(path, std::move(d));
  const std::string bytes = test::read_file(path);
  CHECK(written == bytes.size());

  const auto r = CheckpointReader::open(path, 1u << 30);
  REQUIRE(r.has_value());
  CHECK(r->manifest().params().empty());  // the manifest holds no large field
  CHECK(r->blob_bytes("params") == 4 * kParams);
  std::vector<float> params(kParams);
  r->read_blob("params", params.data(), 4 * kParams);
  CHECK(params == want.params);
  CHECK_THROWS_WITH_AS(r->read_blob("params", params.data(), 4 * kParams - 4), doctest::Contains("not the 19999996 this model needs"),
                       InputError);
  const ckpt::Checkpoint all = r->read_all();
  CHECK(all.step() == 7);
  CHECK(all.links(0).residual() == std::string(1000, '\x01'));
  CHECK(all.algorithm_state() == "the algorithm's own");
  const OptimizerState opt = load_optimizer_state(all, "ck");
  CHECK(opt.buffers == want.optimizer.buffers);
  std::vector<float> back(kParams);
  bytes_to_floats(all.params(), back.data(), kParams, "params");
  CHECK(back == want.params);
  CHECK(r->read_all({"params"}).params().empty());

  auto refused = [&](const std::string& content, const std::vector<std::string>& why) {
    test::write_file(path, content);
    try {
      CheckpointReader::open(path, 1u << 30);
      FAIL("a damaged checkpoint was opened");
    } catch (const InputError& e) {
      MESSAGE(std::string(e.what()));
      for (const auto& w : why) CHECK(std::string(e.what()).find(w) != std::string::npos);
    }
  };
  for (size_t k : {0, 1, 2}) {
    std::string flipped = bytes;
    flipped[params_chunk_at(bytes, k) + 4 + 12345] ^= 0x10;
    refused(flipped, {"blob 'params' chunk " + std::to_string(k + 1) + " of 3", "checksum mismatch", "refusing to load it"});
  }
  std::string crc = bytes;
  crc[params_chunk_at(bytes, 1)] ^= 0x01;  // the checksum itself
  refused(crc, {"blob 'params' chunk 2 of 3", "checksum mismatch"});
  refused(bytes.substr(0, params_chunk_at(bytes, 1) + 100), {"truncated"});
  std::string manifest = bytes;
  manifest[40] ^= 0x01;
  refused(manifest, {"manifest checksum mismatch"});
  refused(bytes + "x", {"appended to"});
}

TEST_CASE("checkpoint file: one written as version 1 (a header and the whole message) is still read") {
  TempDir dir;
  const std::string path = dir.file("old.ckpt");
  ckpt::Checkpoint c;
  c.set_peer("p");
  c.set_step(3);
  const std::vector<float> params{1.0f, 2.0f};
  c.set_params(floats_to_bytes(params.data(), 2));
  const std::string body = c.SerializeAsString();
  char header[24] = {};
  const uint32_t magic = 0x4b435348, version = 1, crc = crc32c(body.data(), body.size());
  const uint64_t len = body.size();
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &version, 4);
  std::memcpy(header + 8, &len, 8);
  std::memcpy(header + 16, &crc, 4);
  test::write_file(path, std::string(header, 24) + body);
  const auto r = CheckpointReader::open(path, 1 << 20);
  REQUIRE(r.has_value());
  CHECK(r->manifest().step() == 3);
  std::vector<float> got(2);
  r->read_blob("params", got.data(), 8);
  CHECK(got == params);
  CHECK(r->read_all({"params"}).params().empty());
}

TEST_CASE("checkpoint file: one written as version 2 (chunks packed, no alignment) is still read, and one of a later "
          "version is refused naming it") {
  TempDir dir;
  const std::string path = dir.file("v2.ckpt");
  ckpt::Checkpoint m;
  m.set_peer("p");
  m.set_step(5);
  const std::vector<float> params{1.5f, -2.0f, 3.25f};
  auto* blob = m.add_blobs();
  blob->set_name("params");
  blob->set_bytes(12);
  const std::string manifest = m.SerializeAsString();
  const uint64_t file_bytes = 32 + manifest.size() + 4 + 12;
  char header[32] = {};
  const uint32_t magic = 0x4b435348, version = 2, crc = crc32c(manifest.data(), manifest.size()), chunk = 8u << 20;
  const uint64_t len = manifest.size();
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &version, 4);
  std::memcpy(header + 8, &len, 8);
  std::memcpy(header + 16, &crc, 4);
  std::memcpy(header + 20, &chunk, 4);
  std::memcpy(header + 24, &file_bytes, 8);
  const uint32_t chunk_crc = crc32c(params.data(), 12);
  std::string file = std::string(header, 32) + manifest + std::string(reinterpret_cast<const char*>(&chunk_crc), 4) +
                     std::string(reinterpret_cast<const char*>(params.data()), 12);
  test::write_file(path, file);
  const auto r = CheckpointReader::open(path, 1 << 20);
  REQUIRE(r.has_value());
  CHECK(r->manifest().step() == 5);
  std::vector<float> got(3);
  r->read_blob("params", got.data(), 12);
  CHECK(got == params);

  const uint32_t later = 4;
  std::memcpy(file.data() + 4, &later, 4);
  test::write_file(path, file);
  CHECK_THROWS_WITH_AS(CheckpointReader::open(path, 1 << 20), doctest::Contains("version 4, this peer reads versions 1 to 3"), InputError);
}

TEST_CASE("checkpoint writer: the write runs on its own thread while the caller goes on, and a write that failed is "
          "reported at the next checkpoint") {
  TempDir dir;
  std::thread::id writer;
  CheckpointWriter::Written seen;
  CheckpointWriter w(true, [&](const CheckpointWriter::Written& done) {
    writer = std::this_thread::get_id();
    seen = done;
  });
  w.submit(dir.file("a.ckpt"), 7, sample_state(), 0.1, 0);
  CHECK(w.finish() >= 0);
  CHECK(writer != std::thread::id());
  CHECK(writer != std::this_thread::get_id());
  CHECK(seen.step == 7);
  CHECK(seen.file_bytes == test::read_file(dir.file("a.ckpt")).size());
  // The snapshot's buffers stay for the next one to copy into, counted as held.
  CHECK(w.held_bytes() == 4 * (kParams + 1000));
  const CheckpointData spare = w.take_spare();
  CHECK(spare.params.size() == kParams);
  CHECK(spare.message == nullptr);
  CHECK(w.held_bytes() == 0);
  REQUIRE(CheckpointReader::open(dir.file("a.ckpt"), 1u << 30).has_value());

  // A directory that cannot be made (a file is in the way): the write fails on the
  // writer's thread, and the step loop hears of it at its next checkpoint.
  test::write_file(dir.file("in_the_way"), "x");
  w.submit(dir.file("in_the_way/b.ckpt"), 8, sample_state(), 0.1, 0);
  CHECK_THROWS_WITH_AS(w.finish(), doctest::Contains("cannot create"), InputError);
  CHECK_NOTHROW(w.finish());  // reported once
}

TEST_CASE("live snapshot: chunks the writer reads before the fence come from the live state, the rest from a copy the "
          "fence makes, so the state written is the one at the checkpoint's step") {
  std::vector<float> live(1000), copy(1000, -1.0f), other(10, 3.0f);
  for (size_t i = 0; i < live.size(); ++i) live[i] = static_cast<float>(i);
  const std::vector<float> at_step = live;
  LiveSnapshot snap;
  snap.add("params", live.data(), live.size(), &copy);
  // The first 100 floats are read live.
  const char* first = snap.begin_chunk(live.data(), 0, 400);
  CHECK(first == reinterpret_cast<const char*>(live.data()));
  snap.end_chunk();
  const LiveSnapshot::Fenced f = snap.freeze();
  CHECK(f.copied_bytes == 3600);
  CHECK(f.waited_bytes == 0);
  CHECK(snap.fenced().copied_bytes == 3600);
  CHECK(snap.freeze().copied_bytes == 0);  // once
  // The step loop writes to its state after the fence: the rest still reads as at the step.
  for (auto& v : live) v = 99.0f;
  const char* rest = snap.begin_chunk(live.data(), 400, 3600);
  CHECK(rest == reinterpret_cast<const char*>(copy.data()) + 400);
  CHECK(std::memcmp(rest, at_step.data() + 100, 3600) == 0);
  snap.end_chunk();
  // Memory it was not given is read where it is.
  CHECK(snap.begin_chunk(other.data(), 4, 8) == reinterpret_cast<const char*>(other.data()) + 4);
  snap.end_chunk();
}

TEST_CASE("live snapshot: the fence waits for the chunk the writer is reading, and copies nothing the writer has read") {
  std::vector<float> live(256, 1.0f), copy(256, 0.0f);
  LiveSnapshot snap;
  snap.add("params", live.data(), live.size(), &copy);
  snap.begin_chunk(live.data(), 0, 1024);  // the whole buffer, under way
  std::atomic<bool> fenced{false};
  std::thread fence([&] {
    snap.freeze();
    fenced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(fenced.load());  // still reading: the state is not the step loop's yet
  snap.end_chunk();
  fence.join();
  CHECK(fenced.load());
  CHECK(snap.fenced().copied_bytes == 0);
  CHECK(copy == std::vector<float>(256, 0.0f));  // nothing was copied over it
}

TEST_CASE("live snapshot: without copies the fence waits until the writer has read every chunk from the live state, "
          "and a writer that gives up releases it") {
  std::vector<float> live(512, 2.0f);
  LiveSnapshot snap;
  snap.add("params", live.data(), live.size(), nullptr);
  snap.begin_chunk(live.data(), 0, 1024);
  snap.end_chunk();  // half read
  std::atomic<bool> fenced{false};
  LiveSnapshot::Fenced f;
  std::thread fence([&] {
    f = snap.freeze();
    fenced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(fenced.load());  // half of the state is still to be read from where it lies
  // After the fence began, the writer still reads the live state (no copy to read from).
  CHECK(snap.begin_chunk(live.data(), 1024, 1024) == reinterpret_cast<const char*>(live.data()) + 1024);
  snap.end_chunk();
  fence.join();
  CHECK(f.waited_bytes == 1024);
  CHECK(f.copied_bytes == 0);

  LiveSnapshot failing;
  failing.add("params", live.data(), live.size(), nullptr);
  std::thread stuck([&] { failing.freeze(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  failing.detach();  // the write failed: nothing more is read, the fence returns
  stuck.join();
}

TEST_CASE("checkpoint writer: a live checkpoint whose state changes right after the fence holds the state of its step, "
          "bit for bit") {
  TempDir dir;
  CheckpointWriter::Written seen;
  CheckpointWriter w(true, [&](const CheckpointWriter::Written& done) { seen = done; });
  const CheckpointData want = sample_state();
  std::vector<float> live_params = want.params, live_velocity = want.optimizer.buffers.at("velocity");
  CheckpointData d = sample_state();
  std::fill(d.params.begin(), d.params.end(), -7.0f);  // the snapshot's buffers hold an older state
  std::fill(d.optimizer.buffers["velocity"].begin(), d.optimizer.buffers["velocity"].end(), -7.0f);
  d.live = std::make_shared<LiveSnapshot>();
  d.live->add("params", live_params.data(), live_params.size(), &d.params);
  d.live->add("velocity", live_velocity.data(), live_velocity.size(), &d.optimizer.buffers["velocity"]);
  w.submit(dir.file("live.ckpt"), 7, std::move(d), 0, 0);
  const LiveSnapshot::Fenced fenced = w.fence();
  // The step loop's next optimizer step.
  std::fill(live_params.begin(), live_params.end(), 42.0f);
  std::fill(live_velocity.begin(), live_velocity.end(), 42.0f);
  w.finish();
  CHECK(seen.copied_bytes == fenced.copied_bytes);
  CHECK(fenced.waited_bytes == 0);
  CHECK_FALSE(w.keeps_copies());
  check_holds(dir.file("live.ckpt"), want);
}

TEST_CASE("checkpoint writer: a live checkpoint with no copies holds none, its page-aligned chunks taken straight from "
          "the live state, and a fence that waits for it makes the writer keep copies from then on") {
  TempDir dir;
  CheckpointWriter::Written seen;
  CheckpointWriter w(true, [&](const CheckpointWriter::Written& done) { seen = done; });
  const CheckpointData want = sample_state();
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  const std::unique_ptr<float, Free> aligned(static_cast<float*>(std::aligned_alloc(4096, (4 * kParams + 4095) / 4096 * 4096)));
  std::copy(want.params.begin(), want.params.end(), aligned.get());
  CheckpointData d = sample_state();
  d.params = {};
  d.optimizer.buffers.clear();
  std::vector<float> live_velocity = want.optimizer.buffers.at("velocity");
  d.live = std::make_shared<LiveSnapshot>();
  d.live->add("params", aligned.get(), kParams, nullptr);
  d.live->add("velocity", live_velocity.data(), live_velocity.size(), nullptr);
  w.submit(dir.file("live.ckpt"), 7, std::move(d), 0, 0);
  CHECK(w.held_bytes() < 1u << 20);  // the message only: no model-sized copy
  const LiveSnapshot::Fenced fenced = w.fence();
  std::fill(aligned.get(), aligned.get() + kParams, 42.0f);  // after the fence: the writer has read it all
  w.finish();
  CHECK(fenced.copied_bytes == 0);
  CHECK(seen.fence_waited_bytes == fenced.waited_bytes);
  // Whether it waited depends on how far the writer had got; if it did, copies are kept.
  CHECK(w.keeps_copies() == (fenced.waited_bytes > 0));
  if (w.keeps_copies()) CHECK(w.take_spare().params.size() == kParams);
  check_holds(dir.file("live.ckpt"), want);
}
