// Checkpoint files: written atomically (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves either the previous checkpoint or the new one, never a
// torn one. Large state (parameters, optimizer buffers, residuals, the algorithm's) goes
// to the file as blobs in chunks with a CRC32C each (docs/CHECKPOINTS.md), written from
// memory as it is, never serialised into one buffer; read back only when the header, the
// manifest and every chunk check out.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hearsay/data.h"
#include "hearsay/optim.h"

namespace hearsay {

// The checkpoint's protobuf schema (proto/hearsay/checkpoint.proto); code that fills or
// reads one includes the header protoc generates for it.
namespace ckpt {
class Checkpoint;
}  // namespace ckpt
class LiveSnapshot;  // src/peer/live_snapshot.h

// A peer's state as a checkpoint writes it: the message with everything but the two
// largest parts, the parameters and the optimizer's buffers, which stay floats (a copy
// into bytes would double them). The message's other large byte fields (link residuals,
// the algorithm's state) are moved out of it as it is written, never copied.
struct CheckpointData {
  std::shared_ptr<ckpt::Checkpoint> message;
  std::vector<float> params;  // empty: the message's params field holds them
  OptimizerState optimizer;   // no name: the message holds the optimizer's state, if any
  // Set (a host peer's background checkpoint): the parameters and the optimizer's buffers
  // it names are read from the live state until its freeze(), then from their copies
  // (`params` and `optimizer.buffers`, where it has them); null: from `params` and
  // `optimizer.buffers`.
  std::shared_ptr<LiveSnapshot> live;
  // Bytes of memory it holds: the snapshot a background write keeps until it is written.
  uint64_t bytes() const;
};

// Writes it (version 3). Throws InputError naming the file when it cannot be written.
// Returns the file's size.
uint64_t write_checkpoint(const std::string& path, CheckpointData&& data);
// The same for a message that holds everything (a copy of it is written).
uint64_t write_checkpoint(const std::string& path, const ckpt::Checkpoint& c);

// A checkpoint file, opened and checked whole before anything is taken from it: the
// header, the manifest, and every chunk's CRC32C in one streaming pass (a damaged or
// truncated chunk is refused here, naming the blob, the chunk and its place in the file,
// and nothing is loaded). Reads both versions.
class CheckpointReader {
 public:
  // nullopt when there is no such file; InputError naming the file and the fault when it
  // is there but damaged. Vetted before a byte of it is read: a regular file (not a FIFO,
  // a device, or a link to one), of at most `max_bytes` (what the model and its state can
  // need: a larger file is refused, never read).
  static std::optional<CheckpointReader> open(const std::string& path, uint64_t max_bytes);
  CheckpointReader(CheckpointReader&&) noexcept;
  ~CheckpointReader();
  // The manifest: every field but the blobs' (version 1: the whole message).
  const ckpt::Checkpoint& manifest() const;
  // Bytes of a blob; 0 when the file has none of that name.
  uint64_t blob_bytes(const std::string& name) const;
  // Reads a blob of exactly `bytes` straight into `out`, chunk by chunk, each checked
  // again (the file may have changed since open). Throws InputError naming the file.
  void read_blob(const std::string& name, void* out, uint64_t bytes) const;
  // The whole message, every blob back in its field, except those named in `except`.
  ckpt::Checkpoint read_all(const std::vector<std::string>& except = {}) const;

 private:
  struct File;
  explicit CheckpointReader(std::unique_ptr<File> f);
  std::unique_ptr<File> f_;
};

// The whole message (CheckpointReader::open, then read_all).
std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path, uint64_t max_bytes);

// What a checkpoint must be to be this run's: its peer, cluster and training digest, a
// model of num_params, a step in [0, last_step], a finite time, and parameters and
// optimizer buffers finite and within kMaxCheckpointValue.
struct CheckpointExpectation {
  std::string peer;
  std::string cluster;          // empty: a peer alone
  std::string training_digest;  // empty: not checked
  uint64_t num_params = 0;
  int64_t last_step = 0;
  std::string optimizer;        // its registered name, said when the optimizers differ
};
inline constexpr float kMaxCheckpointValue = 1e6f;
// The reasons a checkpoint is not this run's own (another peer, cluster or config):
// empty when it is. Provenance only; vet_checkpoint_values checks what it holds.
std::string checkpoint_provenance_mismatch(const ckpt::Checkpoint& c, const CheckpointExpectation& want);
// Throws InputError naming `where` at the first value out of bounds: the model's size,
// the step, the time, a non-finite or absurd parameter or optimizer buffer value.
// `params` (num_params floats), when given, are the checkpoint's parameters read apart
// (CheckpointReader::read_blob), and its message's own params field is not looked at.
void vet_checkpoint_values(const ckpt::Checkpoint& c, const CheckpointExpectation& want, const std::string& where,
                           const float* params = nullptr);

// Little-endian fp32 <-> bytes, for the checkpoint's tensors.
std::string floats_to_bytes(const float* v, size_t n);
// Throws InputError (naming `what`) when the byte count is not 4 * n.
void bytes_to_floats(const std::string& bytes, float* out, size_t n, const std::string& what);

// The optimizer's state in a checkpoint: its name, step count and named buffers.
void save_optimizer_state(const OptimizerState& s, ckpt::Checkpoint& c);
// Reads it back; a checkpoint from before optimizer_buffers gives its velocity, adam_m and
// adam_v as the buffers "velocity", "m" and "v". Throws InputError naming `where` when the
// optimizer is not a registered one, a buffer is named twice, or its bytes are not whole
// floats. Optimizer::load_state() then checks the name and the lengths against its own.
OptimizerState load_optimizer_state(const ckpt::Checkpoint& c, const std::string& where);

// The sampler's place in a checkpoint (epoch, position, the epoch's order), and back;
// BatchSampler::restore() checks it against the shard.
void save_sampler_state(const BatchSampler::State& s, ckpt::Checkpoint& c);
BatchSampler::State load_sampler_state(const ckpt::Checkpoint& c);

}  // namespace hearsay
