// Checkpoint files: written atomically (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves either the previous checkpoint or the new one, never a
// torn one; read back only when the magic, the version, the length and the CRC32C of
// the body all check out.
#pragma once

#include <optional>
#include <string>

#include "hearsay/checkpoint.pb.h"
#include "hearsay/optim.h"

namespace hearsay {

// Throws InputError naming the file when it cannot be written.
void write_checkpoint(const std::string& path, const ckpt::Checkpoint& c);
// nullopt when there is no such file; InputError naming the file and the fault when it
// is there but damaged (it is never half-loaded).
std::optional<ckpt::Checkpoint> read_checkpoint(const std::string& path);

// Little-endian fp32 <-> bytes, for the checkpoint's tensors.
std::string floats_to_bytes(const float* v, size_t n);
// Throws InputError (naming `what`) when the byte count is not 4 * n.
void bytes_to_floats(const std::string& bytes, float* out, size_t n, const std::string& what);

// The optimizer's state in a checkpoint: its kind ("sgd", "adamw"), SGD's velocity or
// AdamW's moments, and its step count.
void save_optimizer_state(const Sgd::State& s, ckpt::Checkpoint& c);
// Reads it back for a model of n parameters. Throws InputError naming `where` when the
// kind is unknown or a buffer's length is not n. Sgd::restore() then checks the kind
// against the configured one.
Sgd::State load_optimizer_state(const ckpt::Checkpoint& c, size_t n, const std::string& where);

}  // namespace hearsay
