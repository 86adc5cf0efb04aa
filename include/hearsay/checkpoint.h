// Checkpoint files: written atomically (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves either the previous checkpoint or the new one, never a
// torn one; read back only when the magic, the version, the length and the CRC32C of
// the body all check out.
#pragma once

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
// is there but damaged (it is never half-loaded).
std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path);

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
