// The checkpoint file (docs/CHECKPOINTS.md). Version 2: a 32-byte header (magic, version,
// manifest length, the manifest's CRC32C, chunk size, the file's length), the manifest
// (the Checkpoint message with its large byte fields empty and the blobs listed), then
// each blob in chunks of the header's size, each chunk a CRC32C of its bytes, then the
// bytes. Large state is written from where it lies, never serialised into one buffer (a
// message tops out at 2 GiB; a 1B-parameter model's parameters alone are 4 GB), and read
// back chunk by chunk into where it goes. Version 1: a 24-byte header and the whole
// message; still read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/error.h"
#include "hearsay/wire.h"
#include "live_snapshot.h"

namespace hearsay {
namespace {

constexpr uint32_t kMagic = 0x4b435348;  // "HSCK" in memory order
constexpr size_t kHeaderV1 = 24;         // magic u32, version u32, body length u64, crc u32, reserved u32
constexpr size_t kHeaderV2 = 32;         // magic u32, version u32, manifest length u64, crc u32, chunk bytes u32, file bytes u64
constexpr uint32_t kChunkBytes = 8u << 20;
// Version 3: each chunk's bytes start on a boundary of this many bytes of the file (its
// CRC32C just before them, zeros before that), so that the disk takes them straight from
// the state's own aligned memory (O_DIRECT), with no copy through a buffer.
constexpr uint64_t kAlign = 4096;
constexpr uint32_t kVersion = 3;
// What a reader accepts from a header: a chunk is read into one buffer of this size.
constexpr uint32_t kMinChunkBytes = 4096, kMaxChunkBytes = 64u << 20;
constexpr uint64_t kMaxManifestBytes = 1u << 30;

// The message field a blob's bytes belong in; null when the name says none of its fields.
std::string* field_of(ckpt::Checkpoint& c, const std::string& name) {
  if (name == "params") return c.mutable_params();
  if (name == "algorithm_state") return c.mutable_algorithm_state();
  auto index = [&](const std::string& prefix, int size) -> int {
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 9) return -1;
    // One spelling per index: "optimizer/00" would name the field "optimizer/0" names.
    if (name[prefix.size()] == '0' && name.size() > prefix.size() + 1) return -1;
    int i = 0;
    for (size_t k = prefix.size(); k < name.size(); ++k) {
      if (name[k] < '0' || name[k] > '9') return -1;
      i = 10 * i + (name[k] - '0');
    }
    return i < size ? i : -1;
  };
  if (const int i = index("optimizer/", c.optimizer_buffers_size()); i >= 0) return c.mutable_optimizer_buffers(i)->mutable_values();
  if (const int i = index("link/", c.links_size()); i >= 0) return c.mutable_links(i)->mutable_residual();
  return nullptr;
}

uint64_t chunks_of(uint64_t bytes, uint32_t chunk) { return (bytes + chunk - 1) / chunk; }

// The zeros before a chunk whose CRC32C would start at `offset` (version 3; none before).
uint64_t pad_before_chunk(uint64_t offset, uint32_t version) {
  return version >= 3 ? (kAlign - (offset + 4) % kAlign) % kAlign : 0;
}

// The bytes of the file a blob of `bytes` takes from `offset` on: its chunks, their CRCs
// and (version 3) their padding. In version 3 every chunk but a blob's last is a whole
// number of blocks (the chunk size is), so the chunks after the first end aligned and
// each needs kAlign - 4 zeros and a CRC: closed form, whatever a header claims.
uint64_t blob_span(uint64_t offset, uint64_t bytes, uint32_t chunk, uint32_t version) {
  const uint64_t count = chunks_of(bytes, chunk);
  if (count == 0) return 0;
  if (version < 3) return bytes + 4 * count;
  return pad_before_chunk(offset, version) + 4 + (count - 1) * kAlign + bytes;
}

void write_fully(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw InputError("checkpoint " + path + ": write failed: " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// The file's bytes, gathered in an aligned buffer and written with O_DIRECT a buffer at a
// time: gigabytes go from this buffer to the disk without passing through the page cache,
// so a checkpoint neither fills memory with dirty pages (the kernel would reclaim and
// write them back on the cores the steps use) nor evicts what the peer reads. The tail,
// shorter than a block, is written through the page cache. Where the filesystem refuses
// O_DIRECT (tmpfs), everything is.
class BlockWriter {
 public:
  BlockWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {
    direct_ = ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_DIRECT) == 0;
    void* b = nullptr;
    if (::posix_memalign(&b, kBlock, kBuffer) != 0) throw std::bad_alloc();
    buffer_.reset(static_cast<char*>(b));
  }
  void append(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t take = std::min(n, kBuffer - used_);
      std::memcpy(buffer_.get() + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == kBuffer) flush_blocks();
    }
  }
  // Writes what is gathered first where fewer than `n` bytes are free, so that the next
  // `n` bytes appended (at most kRoom) go to the buffer without a write to the disk
  // between them: a chunk read from a live snapshot is held only while it is copied.
  void make_room(size_t n) {
    HEARSAY_CHECK(n <= kRoom, "a checkpoint chunk larger than the writer's buffer");
    if (kBuffer - used_ < n) flush_blocks();
  }
  static constexpr size_t kRoom = size_t{8} << 20 | 4096;
  // Appends `n` bytes of zeros.
  void zeros(size_t n) {
    static const char kZeros[kAlign] = {};
    while (n > 0) {
      const size_t take = std::min<size_t>(n, sizeof kZeros);
      append(kZeros, take);
      n -= take;
    }
  }
  // Appends `n` bytes from `data` straight to the disk, not through the buffer, where the
  // file is at a block boundary after what is gathered and `data` and `n` are whole
  // blocks (O_DIRECT's terms); else through the buffer. Either way the file is the same.
  void append_direct(const void* data, size_t n) {
    const auto at = reinterpret_cast<uintptr_t>(data);
    if (!direct_ || used_ % kBlock != 0 || at % kBlock != 0 || n % kBlock != 0) return append(data, n);
    flush_blocks();
    const auto* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 ? errno == EINVAL : static_cast<size_t>(w) < n - done) {
        // Refused (or cut short) by the filesystem: the rest through the buffer, and the
        // page cache from here on (flush_blocks turns O_DIRECT off on its first refusal).
        if (w > 0) done += static_cast<size_t>(w);
        if (done % kBlock != 0) {
          direct_ = false;
          if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0) {
            throw InputError("checkpoint " + path_ + ": fcntl failed: " + std::strerror(errno));
          }
        }
        return append(p + done, n - done);
      }
      if (w < 0) throw InputError("checkpoint " + path_ + ": write failed: " + std::strerror(errno));
      done += static_cast<size_t>(w);
    }
  }
  // Writes what is left; the file is then complete (not yet synced).
  void finish() {
    flush_blocks();
    if (used_ == 0) return;
    if (direct_ && ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0) {
      throw InputError("checkpoint " + path_ + ": fcntl failed: " + std::strerror(errno));
    }
    write_fully(fd_, buffer_.get(), used_, path_);
    used_ = 0;
  }

 private:
  // Room for a whole chunk and its CRC beside a block's remainder (make_room).
  static constexpr size_t kBlock = kAlign, kBuffer = size_t{16} << 20;
  // Writes the whole blocks gathered, keeping the rest for later. A filesystem that took
  // O_DIRECT but refuses its writes (EINVAL), or a short direct write (the file is then
  // off its alignment), turns it off: the rest goes through the page cache.
  void flush_blocks() {
    const size_t whole = direct_ ? used_ / kBlock * kBlock : used_;
    if (whole == 0) return;
    size_t done = 0;
    while (done < whole) {
      const ssize_t w = ::write(fd_, buffer_.get() + done, whole - done);
      if (w < 0 && errno == EINTR) continue;
      if (direct_ && (w < 0 ? errno == EINVAL : static_cast<size_t>(w) < whole - done)) {
        if (w > 0) done += static_cast<size_t>(w);
        direct_ = false;
        if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0) {
          throw InputError("checkpoint " + path_ + ": fcntl failed: " + std::strerror(errno));
        }
        continue;
      }
      if (w < 0) throw InputError("checkpoint " + path_ + ": write failed: " + std::strerror(errno));
      done += static_cast<size_t>(w);
    }
    std::memmove(buffer_.get(), buffer_.get() + whole, used_ - whole);
    used_ -= whole;
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  int fd_;
  std::string path_;
  bool direct_ = false;
  std::unique_ptr<char, Free> buffer_;
  size_t used_ = 0;
};

// Reads exactly n bytes at `offset`; false at the end of the file.
bool read_at(int fd, void* out, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct BlobView {
  std::string name;
  const void* data;
  uint64_t bytes;
};

}  // namespace

uint64_t CheckpointData::bytes() const {
  uint64_t b = params.size() * sizeof(float);
  for (const auto& [name, values] : optimizer.buffers) b += values.size() * sizeof(float);
  if (message) b += message->ByteSizeLong();
  return b;
}

uint64_t write_checkpoint(const std::string& path, const ckpt::Checkpoint& c) {
  CheckpointData d;
  d.message = std::make_shared<ckpt::Checkpoint>(c);
  return write_checkpoint(path, std::move(d));
}

uint64_t write_checkpoint(const std::string& path, CheckpointData&& d) {
  HEARSAY_CHECK(d.message != nullptr, "a checkpoint without its message");
  ckpt::Checkpoint& m = *d.message;
  // The message's large fields are moved out (a string's move keeps its buffer where it
  // is, and `held` never reallocates: its size is reserved), so the views stay good.
  std::vector<std::string> held;
  held.reserve(2 + static_cast<size_t>(m.links_size() + m.optimizer_buffers_size()));
  std::vector<BlobView> blobs;
  auto take = [&](std::string* field, const std::string& name) {
    if (field->empty()) return;
    held.push_back(std::move(*field));
    field->clear();
    blobs.push_back({name, held.back().data(), held.back().size()});
  };
  m.clear_blobs();
  // A live snapshot's buffers are written from the live state (live_snapshot.h): the
  // blob's data is the live memory, which begin_chunk maps to where to read it now.
  const std::vector<LiveSnapshot::View> live = d.live ? d.live->views() : std::vector<LiveSnapshot::View>{};
  const auto live_params = std::find_if(live.begin(), live.end(), [](const LiveSnapshot::View& v) { return v.name == "params"; });
  if (live_params != live.end()) {
    m.clear_params();
    blobs.push_back({"params", live_params->live, live_params->n * sizeof(float)});
  } else if (!d.params.empty()) {
    m.clear_params();
    blobs.push_back({"params", d.params.data(), d.params.size() * sizeof(float)});
  } else {
    take(m.mutable_params(), "params");
  }
  if (!d.optimizer.optimizer.empty()) {
    m.clear_optimizer_buffers();
    m.set_optimizer(d.optimizer.optimizer);
    m.set_optimizer_steps(d.optimizer.steps);
    const bool live_optimizer = live.size() > (live_params != live.end() ? 1u : 0u);
    for (const auto& v : live) {
      if (v.name == "params") continue;
      m.add_optimizer_buffers()->set_name(v.name);
      blobs.push_back({"optimizer/" + std::to_string(m.optimizer_buffers_size() - 1), v.live, v.n * sizeof(float)});
    }
    for (const auto& [name, values] : d.optimizer.buffers) {
      if (live_optimizer) break;
      m.add_optimizer_buffers()->set_name(name);
      blobs.push_back({"optimizer/" + std::to_string(m.optimizer_buffers_size() - 1), values.data(), values.size() * sizeof(float)});
    }
  } else {
    for (int i = 0; i < m.optimizer_buffers_size(); ++i) take(m.mutable_optimizer_buffers(i)->mutable_values(), "optimizer/" + std::to_string(i));
  }
  for (int i = 0; i < m.links_size(); ++i) take(m.mutable_links(i)->mutable_residual(), "link/" + std::to_string(i));
  take(m.mutable_algorithm_state(), "algorithm_state");
  for (const auto& b : blobs) {
    ckpt::Blob* r = m.add_blobs();
    r->set_name(b.name);
    r->set_bytes(b.bytes);
  }
  std::string manifest;
  if (!m.SerializeToString(&manifest)) throw InputError("checkpoint " + path + ": could not serialise its manifest");
  uint64_t file_bytes = kHeaderV2 + manifest.size();
  for (const auto& b : blobs) file_bytes += blob_span(file_bytes, b.bytes, kChunkBytes, kVersion);

  char header[kHeaderV2] = {};
  const uint32_t version = kVersion, crc = crc32c(manifest.data(), manifest.size());
  const uint64_t manifest_len = manifest.size();
  std::memcpy(header, &kMagic, 4);
  std::memcpy(header + 4, &version, 4);
  std::memcpy(header + 8, &manifest_len, 8);
  std::memcpy(header + 16, &crc, 4);
  std::memcpy(header + 20, &kChunkBytes, 4);
  std::memcpy(header + 24, &file_bytes, 8);

  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError("checkpoint " + tmp + ": cannot create: " + std::strerror(errno));
  try {
    BlockWriter out(fd, tmp);
    out.append(header, kHeaderV2);
    out.append(manifest.data(), manifest.size());
    uint64_t offset = kHeaderV2 + manifest.size();
    for (const auto& b : blobs) {
      for (uint64_t at = 0; at < b.bytes; at += kChunkBytes) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, b.bytes - at));
        const size_t pad = pad_before_chunk(offset, kVersion);
        out.make_room(pad + 4 + n);
        // From the live state or the snapshot's copy (live_snapshot.h); the CRC and the
        // bytes from the same memory, before the step loop may change them.
        const char* p = d.live ? d.live->begin_chunk(b.data, at, n) : static_cast<const char*>(b.data) + at;
        const uint32_t chunk_crc = crc32c(p, n);
        out.zeros(pad);
        out.append(&chunk_crc, 4);
        out.append_direct(p, n);
        if (d.live) d.live->end_chunk();
        offset += pad + 4 + n;
      }
    }
    HEARSAY_CHECK(offset == file_bytes, "a checkpoint's layout and its length disagree");
    out.finish();
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
  return file_bytes;
}

// --- reading ---------------------------------------------------------------------------

struct CheckpointReader::File {
  std::string path;
  int fd = -1;
  uint32_t version = 0;
  uint32_t chunk_bytes = 0;
  ckpt::Checkpoint manifest;
  struct At {
    uint64_t offset = 0, bytes = 0;  // where its first chunk starts in the file; its length
  };
  std::map<std::string, At> blobs;

  ~File() {
    if (fd >= 0) ::close(fd);
  }
  InputError refuse(const std::string& why) const {
    return InputError("checkpoint " + path + ": " + why + "; refusing to load it (move it away to start afresh)");
  }
  // Reads blob `name` chunk by chunk: each chunk's bytes go to out + its place (null: a
  // buffer of one chunk, only checked), its CRC32C checked.
  void read_chunks(const std::string& name, const At& at, char* out) const {
    std::vector<char> scratch(out == nullptr ? std::min<uint64_t>(chunk_bytes, at.bytes) : 0);
    const uint64_t count = chunks_of(at.bytes, chunk_bytes);
    uint64_t offset = at.offset;
    for (uint64_t k = 0; k < count; ++k) {
      offset += pad_before_chunk(offset, version);
      const uint64_t pos = k * chunk_bytes;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, at.bytes - pos));
      char* dst = out != nullptr ? out + pos : scratch.data();
      uint32_t want = 0;
      const std::string which = "blob '" + name + "' chunk " + std::to_string(k + 1) + " of " + std::to_string(count) +
                                " (file bytes " + std::to_string(offset) + " to " + std::to_string(offset + 4 + n) + ")";
      if (!read_at(fd, &want, 4, offset) || !read_at(fd, dst, n, offset + 4)) throw refuse(which + ": the file ends inside it (truncated?)");
      if (crc32c(dst, n) != want) throw refuse(which + ": checksum mismatch (the file is damaged)");
      offset += 4 + n;
    }
  }
};

CheckpointReader::CheckpointReader(std::unique_ptr<File> f) : f_(std::move(f)) {}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

const ckpt::Checkpoint& CheckpointReader::manifest() const { return f_->manifest; }

std::optional<CheckpointReader> CheckpointReader::open(const std::string& path, uint64_t max_bytes) {
  auto f = std::make_unique<File>();
  f->path = path;
  // Opened without blocking (a FIFO would wait for a writer forever), then vetted on the
  // descriptor itself, so what is checked is what is read.
  f->fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f->fd < 0 && errno == ENOENT) return std::nullopt;
  if (f->fd < 0) throw InputError("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f->fd, &st) != 0) throw f->refuse(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    throw f->refuse(std::string("not a regular file (") +
                    (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISDIR(st.st_mode) ? "a directory" : "a special file") +
                    ")");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderV1) throw f->refuse("only " + std::to_string(size) + " bytes, shorter than its header");
  if (size > max_bytes) {
    throw f->refuse(std::to_string(size) + " bytes, more than this run's model and state can need (" + std::to_string(max_bytes) +
                    " at most)");
  }
  char header[kHeaderV2] = {};
  if (!read_at(f->fd, header, std::min<uint64_t>(size, kHeaderV2), 0)) throw f->refuse("shorter than when it was opened (written to meanwhile?)");
  uint32_t magic, crc;
  uint64_t len;
  std::memcpy(&magic, header, 4);
  std::memcpy(&f->version, header + 4, 4);
  std::memcpy(&len, header + 8, 8);
  std::memcpy(&crc, header + 16, 4);
  if (magic != kMagic) throw f->refuse("not a hearsay checkpoint (bad magic)");
  if (f->version == 1) {
    if (len != size - kHeaderV1) {
      throw f->refuse("header says " + std::to_string(len) + " body bytes, the file has " + std::to_string(size - kHeaderV1) + " (truncated?)");
    }
    std::string body(len, '\0');
    if (!read_at(f->fd, body.data(), len, kHeaderV1)) throw f->refuse("shorter than when it was opened (written to meanwhile?)");
    if (crc32c(body.data(), body.size()) != crc) throw f->refuse("checksum mismatch (the file is damaged)");
    if (!f->manifest.ParseFromString(body)) throw f->refuse("its body does not parse");
    return CheckpointReader(std::move(f));
  }
  if (f->version != 2 && f->version != 3) {
    throw f->refuse("version " + std::to_string(f->version) + ", this peer reads versions 1 to 3");
  }
  if (size < kHeaderV2) throw f->refuse("only " + std::to_string(size) + " bytes, shorter than its header");
  uint64_t file_bytes;
  std::memcpy(&f->chunk_bytes, header + 20, 4);
  std::memcpy(&file_bytes, header + 24, 8);
  if (file_bytes != size) {
    throw f->refuse("header says " + std::to_string(file_bytes) + " bytes, the file has " + std::to_string(size) +
                    (size < file_bytes ? " (truncated?)" : " (appended to?)"));
  }
  if (f->chunk_bytes < kMinChunkBytes || f->chunk_bytes > kMaxChunkBytes) {
    throw f->refuse("its chunk size " + std::to_string(f->chunk_bytes) + " is outside " + std::to_string(kMinChunkBytes) + ".." +
                    std::to_string(kMaxChunkBytes));
  }
  if (f->version >= 3 && f->chunk_bytes % kAlign != 0) {
    throw f->refuse("its chunk size " + std::to_string(f->chunk_bytes) + " is not a multiple of " + std::to_string(kAlign));
  }
  if (len > size - kHeaderV2 || len > kMaxManifestBytes) throw f->refuse("its manifest of " + std::to_string(len) + " bytes does not fit the file");
  std::string manifest(len, '\0');
  if (!read_at(f->fd, manifest.data(), len, kHeaderV2)) throw f->refuse("shorter than when it was opened (written to meanwhile?)");
  if (crc32c(manifest.data(), manifest.size()) != crc) throw f->refuse("manifest checksum mismatch (the file is damaged)");
  if (!f->manifest.ParseFromString(manifest)) throw f->refuse("its manifest does not parse");
  // The blobs: names of fields the manifest has, each once, exactly filling the file.
  uint64_t offset = kHeaderV2 + len;
  for (const ckpt::Blob& b : f->manifest.blobs()) {
    const std::string name = wire_text(b.name());
    std::string* field = field_of(f->manifest, b.name());
    if (field == nullptr) throw f->refuse("blob '" + name + "' is none of the checkpoint's fields");
    if (!field->empty()) throw f->refuse("blob '" + name + "' is also in the manifest");
    if (b.bytes() > size) throw f->refuse("blob '" + name + "' of " + std::to_string(b.bytes()) + " bytes does not fit the file");
    if (!f->blobs.emplace(b.name(), File::At{offset, b.bytes()}).second) throw f->refuse("blob '" + name + "' appears twice");
    offset += blob_span(offset, b.bytes(), f->chunk_bytes, f->version);
    if (offset > size) throw f->refuse("its blobs need more bytes than the file has (truncated?)");
  }
  if (offset != size) throw f->refuse("its blobs end at byte " + std::to_string(offset) + " of " + std::to_string(size));
  // Every chunk checked before anything is taken: a damaged file loads nothing.
  for (const ckpt::Blob& b : f->manifest.blobs()) f->read_chunks(wire_text(b.name()), f->blobs.at(b.name()), nullptr);
  return CheckpointReader(std::move(f));
}

uint64_t CheckpointReader::blob_bytes(const std::string& name) const {
  if (f_->version == 1) {
    std::string* field = field_of(f_->manifest, name);
    return field != nullptr ? field->size() : 0;
  }
  const auto it = f_->blobs.find(name);
  return it == f_->blobs.end() ? 0 : it->second.bytes;
}

void CheckpointReader::read_blob(const std::string& name, void* out, uint64_t bytes) const {
  const uint64_t have = blob_bytes(name);
  if (have != bytes) {
    throw f_->refuse("its " + name + " are " + std::to_string(have) + " bytes, not the " + std::to_string(bytes) + " this model needs");
  }
  if (bytes == 0) return;
  if (f_->version == 1) {
    std::memcpy(out, field_of(f_->manifest, name)->data(), bytes);
    return;
  }
  f_->read_chunks(name, f_->blobs.at(name), static_cast<char*>(out));
}

ckpt::Checkpoint CheckpointReader::read_all(const std::vector<std::string>& except) const {
  ckpt::Checkpoint c = f_->manifest;
  const auto skipped = [&](const std::string& name) { return std::find(except.begin(), except.end(), name) != except.end(); };
  if (f_->version == 1) {
    for (const auto& name : except) {
      if (std::string* field = field_of(c, name)) field->clear();
    }
    return c;
  }
  for (const auto& [name, at] : f_->blobs) {
    if (skipped(name)) continue;
    std::string* field = field_of(c, name);
    field->resize(at.bytes);
    f_->read_chunks(name, at, field->data());
  }
  c.clear_blobs();
  return c;
}

std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path, uint64_t max_bytes) {
  const auto r = CheckpointReader::open(path, max_bytes);
  if (!r) return std::nullopt;
  return r->read_all();
}

}  // namespace hearsay
