// What the engine and the peer train: any model whose parameters live in ONE flat device
// buffer and whose gradients live in another of the same layout, with named views of
// the slices. The gossip engine, the codecs and the algorithms see only this interface:
// the MLP/CNN `Model` implements it, and so can a transformer or a model owned by another
// framework, without a change to them. docs/ARCHITECTURE.md, "Adding a model".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hearsay/backend.h"

namespace hearsay {

// A named slice of the flat parameter (and gradient) buffer.
struct ParamView {
  std::string name;  // "fc1.weight"
  size_t offset = 0;
  size_t size = 0;
  std::vector<int> shape;  // weights are [out, in] (conv: [out, k*k*in]); codecs read it
};

// What a forward pass measured, summed over the batch: the log's loss and accuracy (bits
// per byte of a language model is loss / ln 2 per byte; its `correct` counts next tokens
// guessed right).
struct BatchStats {
  double loss_sum = 0.0;  // sum over the batch of per-example cross-entropy (nats)
  int64_t correct = 0;
  int64_t count = 0;
  double loss() const { return count > 0 ? loss_sum / count : 0.0; }
  double accuracy() const { return count > 0 ? static_cast<double>(correct) / count : 0.0; }
  BatchStats& operator+=(const BatchStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
    return *this;
  }
};

// What a batch holds: dense features ([rows, input_dim] floats, one class label per row),
// or token sequences (int32 token ids in `x`, the next-token targets in `y`).
enum class BatchKind { kFeatures, kTokens };

// A minibatch already on the trainable's device. `x` points to floats for kFeatures and
// to int32 token ids for kTokens; `y` to int32 targets; `rows` examples.
struct Batch {
  const void* x = nullptr;
  const int32_t* y = nullptr;
  int rows = 0;
};

class Trainable {
 public:
  virtual ~Trainable() = default;

  virtual Backend& backend() const = 0;
  virtual BatchKind batch_kind() const = 0;
  // The most rows a batch may have (its activations are sized for it).
  virtual int max_batch() const = 0;
  virtual size_t num_params() const = 0;
  virtual const std::vector<ParamView>& param_views() const = 0;
  // Device pointers to the flat buffers (num_params() floats each).
  virtual float* params() const = 0;
  virtual float* grads() const = 0;

  // One forward and backward pass: overwrites grads() with the gradient of the batch's
  // mean loss. Waits for the device to report the batch's loss.
  virtual BatchStats forward_backward(const Batch& batch) = 0;
  // Forward pass only.
  virtual BatchStats evaluate(const Batch& batch) = 0;

  // Host copies of the flat parameters (checkpoints, tests, gossip).
  std::vector<float> get_params() const;
  void set_params(const std::vector<float>& host);

  // One line per layer or block, for the log's start event.
  virtual std::string summary() const = 0;
  // Floating-point operations of the matrix products in one training step, per example
  // (0 when unknown): what compute-utilisation figures divide by.
  virtual double gemm_flops_per_sample() const { return 0; }
};

}  // namespace hearsay
