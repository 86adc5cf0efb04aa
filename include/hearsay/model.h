// Models: a stack of layers whose parameters live in ONE contiguous device buffer and whose
// gradients live in another of the same layout. Per-layer views (ParamView) name the
// slices. Codecs, mixers and transports work on the flat buffers directly.
//
// Activations are NHWC; a flat input of D features is 1x1xD. A model is owned by one
// peer and used from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/trainable.h"

namespace hearsay {

// A decoder-only transformer over bytes (kind kGpt; src/model/gpt.h).
struct GptSpec {
  int vocab = 256;  // byte-level: every text trains without a tokenizer
  int context = 128;
  int layers = 4;
  int heads = 4;
  int width = 128;  // a multiple of heads
};

struct ModelSpec {
  enum class Kind { kLogReg, kMlp, kCnn, kGpt };
  Kind kind = Kind::kMlp;
  // Input image shape; flat inputs use height = width = 1 and channels = features.
  int height = 1, width = 1, channels = 1;
  int num_classes = 10;
  std::vector<int> hidden;         // MLP hidden widths
  std::vector<int> conv_channels;  // CNN: output channels of the two conv layers
  int kernel = 5;                  // CNN conv kernel size (odd; "same" padding)
  int fc_width = 128;              // CNN hidden fully connected width
  GptSpec gpt;                     // kGpt

  int input_dim() const { return height * width * channels; }
};

class Layer;

class Model final : public Trainable {
 public:
  // Builds the model, allocates parameters, gradients and activations for up to max_batch
  // samples on `backend` (which must outlive the model), and initialises the parameters
  // deterministically from `seed`. Throws InputError for an impossible shape.
  Model(const ModelSpec& spec, Backend& backend, int max_batch, uint64_t seed);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return spec_; }
  Backend& backend() const override { return backend_; }
  BatchKind batch_kind() const override { return BatchKind::kFeatures; }
  size_t num_params() const override { return num_params_; }
  int max_batch() const override { return max_batch_; }
  const std::vector<ParamView>& param_views() const override { return views_; }
  float* params() const override { return params_.f32(); }
  float* grads() const override { return grads_.f32(); }

  // One forward and backward pass over a minibatch already on the device: x is
  // [batch, input_dim], labels [batch]. Overwrites grads() with the gradient of the mean
  // loss. Waits for the device to report the batch's loss.
  BatchStats forward_backward(const float* x, const int32_t* labels, int batch);
  // Forward pass only.
  BatchStats evaluate(const float* x, const int32_t* labels, int batch);
  // The same through the Trainable interface (x: floats).
  BatchStats forward_backward(const Batch& b) override {
    return forward_backward(static_cast<const float*>(b.x), b.y, b.rows);
  }
  BatchStats evaluate(const Batch& b) override { return evaluate(static_cast<const float*>(b.x), b.y, b.rows); }

  // Floating-point operations of the matrix products in one training step, per sample.
  double gemm_flops_per_sample() const override;
  // One line per layer: "conv1 28x28x1 -> 28x28x16 (416 params)".
  std::string summary() const override;

 private:
  void forward(const float* x, int batch);

  ModelSpec spec_;
  Backend& backend_;
  int max_batch_;
  size_t num_params_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<size_t> layer_offsets_;
  std::vector<ParamView> views_;
  DeviceBuffer params_, grads_;
  std::vector<DeviceBuffer> acts_;   // acts_[i]: output of layer i
  std::vector<DeviceBuffer> dacts_;  // dacts_[i]: gradient w.r.t. acts_[i]
  DeviceBuffer stats_;
};

// The one place that knows which models exist: builds the model `spec` names (the LOGREG,
// MLP and CNN kinds of `Model`, the GPT of gpt.h) behind the Trainable interface. For the
// GPT, max_batch counts sequences of gpt.context tokens.
std::unique_ptr<Trainable> create_model(const ModelSpec& spec, Backend& backend, int max_batch, uint64_t seed);

// The prompt followed by `tokens` bytes sampled one at a time from a GPT's next-byte
// distribution at `temperature` (0: the likeliest byte each time), seeded. Throws
// InputError when the model is not a GPT or an argument is out of range.
std::string generate_text(Trainable& model, const std::string& prompt, int tokens, double temperature,
                          uint64_t seed);

// Number of classes and input shape come from the data; this fills them in and checks the
// spec. Throws InputError naming the problem.
void check_model_spec(const ModelSpec& spec);

}  // namespace hearsay
