// Checkpoint files: written atomically (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves either the previous checkpoint or the new one, never a
// torn one; read back only when the magic, the version, the length and the CRC32C of
// the body all check out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hearsay/data.h"
#include "hearsay/optim.h"

namespace hearsay {

// The checkpoint's protobuf schema (proto/hearsay/checkpoint.proto); code that fills or
// reads one includes the header protoc generates for it.
namespace ckpt {
class Checkpoint;
}  // namespace ckpt

// Throws InputError naming the file when it cannot be written.
void write_checkpoint(const std::string& path, const ckpt::Checkpoint& c);
// nullopt when there is no such file; InputError naming the file and the fault when it
// is there but damaged (it is never half-loaded). Vetted before a byte of it is read: a
// regular file (not a FIFO, a device, or a link to one), of at most `max_bytes` (what
// the model and its state can need: a larger file is refused, never read into memory).
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
void vet_checkpoint_values(const ckpt::Checkpoint& c, const CheckpointExpectation& want, const std::string& where);

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
