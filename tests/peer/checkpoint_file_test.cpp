// The checkpoint file (src/peer/checkpoint_file.cpp) and its background writer
// (src/peer/checkpoint_writer.cpp): large state in chunks with a checksum each, a damaged
// chunk refused before anything is read, and a write that runs beside the steps.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/error.h"
#include "hearsay/wire.h"
#include "../../src/peer/checkpoint_writer.h"
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

// Where the params blob's chunk k (0-based) starts in the file: after the header and the
// manifest, each chunk a 4-byte CRC and its bytes.
size_t params_chunk_at(const std::string& bytes, size_t k) {
  uint64_t manifest = 0;
  std::memcpy(&manifest, bytes.data() + 8, 8);
  return 32 + manifest + k * (4 + kChunk);
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
