#include "hearsay/checkpoint.pb.h"
#include "hearsay/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path, uint64_t max_bytes) {
  auto refuse = [&](const std::string& why) {
    return InputError("checkpoint " + path + ": " + why + "; refusing to load it (move it away to start afresh)");
  };
  // Opened without blocking (a FIFO would wait for a writer forever), then vetted on the
  // descriptor itself, so what is checked is what is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  if (fd < 0) throw InputError("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw refuse(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    throw refuse(std::string("not a regular file (") +
                 (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISDIR(st.st_mode) ? "a directory" : "a special file") +
                 ")");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeader) throw refuse("only " + std::to_string(size) + " bytes, shorter than its header");
  if (size > max_bytes) {
    throw refuse(std::to_string(size) + " bytes, more than this run's model and state can need (" + std::to_string(max_bytes) +
                 " at most)");
  }
  std::string data(size, '\0');
  for (size_t at = 0; at < size;) {
    const ssize_t n = ::read(fd, data.data() + at, size - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw refuse(std::string("read failed: ") + std::strerror(errno));
    if (n == 0) throw refuse("shorter than when it was opened (written to meanwhile?)");
    at += static_cast<size_t>(n);
  }
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
std::string first_bad_value(const std::string& bytes, float bound) {
  const size_t n = bytes.size() / 4;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    if (!std::isfinite(v) || std::fabs(v) > bound) return "element " + std::to_string(i) + " is " + std::to_string(v);
  }
  return {};
}

}  // namespace

void vet_checkpoint_values(const ckpt::Checkpoint& c, const CheckpointExpectation& want, const std::string& where) {
  auto refuse = [&](const std::string& why) { return InputError(where + ": " + why + "; refusing to load it"); };
  if (c.num_params() != want.num_params) {
    throw refuse("holds a model of " + std::to_string(c.num_params()) + " parameters, this config's has " + std::to_string(want.num_params));
  }
  if (c.step() < 0 || c.step() > want.last_step) {
    throw refuse("its step " + std::to_string(c.step()) + " is outside this run's 0.." + std::to_string(want.last_step));
  }
  if (!std::isfinite(c.wall_s()) || c.wall_s() < 0 || c.wall_s() > 1e9) throw refuse("its time (wall_s " + std::to_string(c.wall_s()) + ") is not a time");
  if (c.params().size() != 4 * want.num_params) {
    throw refuse("its parameters are " + std::to_string(c.params().size()) + " bytes, not " + std::to_string(4 * want.num_params));
  }
  if (const std::string bad = first_bad_value(c.params(), kMaxCheckpointValue); !bad.empty()) {
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
