#include "hearsay/checkpoint.pb.h"
#include "hearsay/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hearsay/error.h"
#include "hearsay/wire.h"

namespace hearsay {
namespace {

constexpr uint32_t kMagic = 0x4b435348;  // "HSCK" in memory order
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 24;           // magic u32, version u32, body length u64, crc u32, reserved u32

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw InputError("checkpoint " + path + ": write failed: " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void write_checkpoint(const std::string& path, const ckpt::Checkpoint& c) {
  std::string body;
  if (!c.SerializeToString(&body)) throw InputError("checkpoint " + path + ": could not serialise (over 2 GiB?)");
  char header[kHeader] = {};
  const uint64_t len = body.size();
  const uint32_t crc = crc32c(body.data(), body.size());
  std::memcpy(header, &kMagic, 4);
  std::memcpy(header + 4, &kVersion, 4);
  std::memcpy(header + 8, &len, 8);
  std::memcpy(header + 16, &crc, 4);
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError("checkpoint " + tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, header, kHeader, tmp);
    write_all(fd, body.data(), body.size(), tmp);
    if (::fsync(fd) != 0) throw InputError("checkpoint " + tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError("checkpoint " + path + ": rename failed: " + why);
  }
  // The rename itself must survive a crash too.
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  auto refuse = [&](const std::string& why) {
    return InputError("checkpoint " + path + ": " + why + "; refusing to load it (move it away to start afresh)");
  };
  if (data.size() < kHeader) throw refuse("only " + std::to_string(data.size()) + " bytes, shorter than its header");
  uint32_t magic, version, crc;
  uint64_t len;
  std::memcpy(&magic, data.data(), 4);
  std::memcpy(&version, data.data() + 4, 4);
  std::memcpy(&len, data.data() + 8, 8);
  std::memcpy(&crc, data.data() + 16, 4);
  if (magic != kMagic) throw refuse("not a hearsay checkpoint (bad magic)");
  if (version != kVersion) throw refuse("version " + std::to_string(version) + ", this peer reads version 1");
  if (len != data.size() - kHeader) {
    throw refuse("header says " + std::to_string(len) + " body bytes, the file has " + std::to_string(data.size() - kHeader) +
                 " (truncated?)");
  }
  if (crc32c(data.data() + kHeader, len) != crc) throw refuse("checksum mismatch (the file is damaged)");
  ckpt::Checkpoint c;
  if (!c.ParseFromArray(data.data() + kHeader, static_cast<int>(len))) throw refuse("its body does not parse");
  return c;
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
