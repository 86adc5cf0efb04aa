// streaming_diloco's fragments: the model's units dealt out in turn, strided as the paper
// deals transformer blocks (fragment p holds blocks p, p + P, p + 2P, ...), so that each
// fragment is about 1/P of the model and syncs its share of the bytes.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/trainable.h"

namespace hearsay {

// The unit a parameter tensor belongs to: its name up to the first part that is a number
// (a block of a stack: "h.3.attn.c_attn.weight" -> "h.3", torch's
// "transformer.h.3.mlp.c_fc.weight" -> "transformer.h.3", "layer1.0.conv1.weight" ->
// "layer1.0"), else its first part ("wte" -> "wte", "ln_f.weight" -> "ln_f",
// "fc1.weight" -> "fc1").
std::string unit_of(const std::string& name);

// (offset, size) ranges of the flat buffer, per fragment.
using Fragment = std::vector<std::pair<size_t, size_t>>;

// The model's units in their order (consecutive tensors of one unit are one unit), dealt
// to p fragments in turn. Throws InputError when the model has fewer than p units.
std::vector<Fragment> fragments_of(const Trainable& model, int p);

}  // namespace hearsay
