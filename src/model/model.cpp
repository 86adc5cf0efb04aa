#include "hearsay/model.h"

#include <sstream>

#include "conv.h"
#include "dense.h"
#include "gpt.h"
#include "hearsay/error.h"
#include "maxpool.h"

namespace hearsay {

std::string Shape::str() const {
  return std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c);
}

size_t Layer::param_count() const {
  size_t n = 0;
  for (const auto& [suffix, shape] : param_shapes()) {
    size_t s = 1;
    for (int d : shape) s *= static_cast<size_t>(d);
    n += s;
  }
  return n;
}

namespace {

// Bounds that keep every size product far from int overflow in BLAS calls.
constexpr int kMaxWidth = 1 << 16;
constexpr int64_t kMaxInput = 1 << 24;

std::vector<std::unique_ptr<Layer>> build_layers(const ModelSpec& s) {
  std::vector<std::unique_ptr<Layer>> layers;
  Shape in{s.height, s.width, s.channels};
  switch (s.kind) {
    case ModelSpec::Kind::kLogReg:
      layers.push_back(std::make_unique<DenseLayer>("linear", in, s.num_classes, Activation::kNone));
      break;
    case ModelSpec::Kind::kMlp: {
      int i = 1;
      for (int width : s.hidden) {
        layers.push_back(std::make_unique<DenseLayer>("fc" + std::to_string(i++), in, width, Activation::kRelu));
        in = layers.back()->output_shape();
      }
      layers.push_back(std::make_unique<DenseLayer>("fc" + std::to_string(i), in, s.num_classes, Activation::kNone));
      break;
    }
    case ModelSpec::Kind::kCnn: {
      int i = 1;
      for (int ch : s.conv_channels) {
        layers.push_back(std::make_unique<ConvLayer>("conv" + std::to_string(i), in, ch, s.kernel, Activation::kRelu));
        in = layers.back()->output_shape();
        layers.push_back(std::make_unique<MaxPoolLayer>("pool" + std::to_string(i++), in));
        in = layers.back()->output_shape();
      }
      layers.push_back(std::make_unique<DenseLayer>("fc1", in, s.fc_width, Activation::kRelu));
      layers.push_back(std::make_unique<DenseLayer>("fc2", layers.back()->output_shape(), s.num_classes, Activation::kNone));
      break;
    }
    case ModelSpec::Kind::kGpt:
      throw InputError("model: the GPT is not a stack of layers (create_model builds it)");
  }
  return layers;
}

}  // namespace

void check_model_spec(const ModelSpec& s) {
  if (s.kind == ModelSpec::Kind::kGpt) {
    check_gpt_spec(s.gpt);
    return;
  }
  auto fail = [](const std::string& m) { throw InputError("impossible model shape: " + m); };
  if (s.height < 1 || s.width < 1 || s.channels < 1) fail("input shape must be positive");
  if (static_cast<int64_t>(s.height) * s.width * s.channels > kMaxInput) fail("input has more than 2^24 features");
  if (s.num_classes < 2 || s.num_classes > kMaxWidth) fail("num_classes must be in [2, 65536], got " + std::to_string(s.num_classes));
  if (s.kind == ModelSpec::Kind::kMlp) {
    for (size_t i = 0; i < s.hidden.size(); ++i) {
      if (s.hidden[i] < 1 || s.hidden[i] > kMaxWidth) {
        fail("mlp hidden[" + std::to_string(i) + "] = " + std::to_string(s.hidden[i]) + " must be in [1, 65536]");
      }
    }
  }
  if (s.kind == ModelSpec::Kind::kCnn) {
    if (s.height == 1 || s.width == 1) {
      fail("cnn needs image input (height and width > 1), but the data is flat with " + std::to_string(s.input_dim()) + " features");
    }
    if (s.conv_channels.empty()) fail("cnn needs at least one conv layer (conv_channels)");
    if (s.kernel < 1 || s.kernel % 2 == 0 || s.kernel > 15) fail("cnn kernel must be odd and in [1, 15], got " + std::to_string(s.kernel));
    if (s.fc_width < 1 || s.fc_width > kMaxWidth) fail("cnn fc_width must be in [1, 65536], got " + std::to_string(s.fc_width));
    int h = s.height, w = s.width;
    for (size_t i = 0; i < s.conv_channels.size(); ++i) {
      if (s.conv_channels[i] < 1 || s.conv_channels[i] > 4096) {
        fail("cnn conv_channels[" + std::to_string(i) + "] must be in [1, 4096]");
      }
      if (h % 2 != 0 || w % 2 != 0) {
        fail("cnn: input to pool" + std::to_string(i + 1) + " is " + std::to_string(h) + "x" + std::to_string(w) +
             "; 2x2 pooling needs even height and width");
      }
      h /= 2;
      w /= 2;
    }
  }
}

Model::Model(const ModelSpec& spec, Backend& backend, int max_batch, uint64_t seed)
    : spec_(spec), backend_(backend), max_batch_(max_batch) {
  check_model_spec(spec);
  if (max_batch < 1) throw InputError("model: batch size must be >= 1, got " + std::to_string(max_batch));
  layers_ = build_layers(spec);

  for (const auto& layer : layers_) {
    layer_offsets_.push_back(num_params_);
    for (const auto& [suffix, shape] : layer->param_shapes()) {
      ParamView v{layer->name() + "." + suffix, num_params_, 1, shape};
      for (int d : shape) v.size *= static_cast<size_t>(d);
      num_params_ += v.size;
      views_.push_back(std::move(v));
    }
  }

  params_ = DeviceBuffer(backend_, sizeof(float) * num_params_);
  grads_ = DeviceBuffer(backend_, sizeof(float) * num_params_);
  stats_ = DeviceBuffer(backend_, sizeof(float) * 2);
  for (const auto& layer : layers_) {
    layer->prepare(backend_, max_batch);
    const size_t n = sizeof(float) * static_cast<size_t>(max_batch) * layer->output_shape().size();
    acts_.emplace_back(backend_, n);
    dacts_.emplace_back(backend_, n);
  }

  // Each layer draws from its own stream, so adding a layer does not reshuffle the others.
  std::vector<float> host(num_params_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Rng rng(seed, 1000 + i);
    layers_[i]->init(host.data() + layer_offsets_[i], rng);
  }
  set_params(host);
}

Model::~Model() = default;

void Model::forward(const float* x, int batch) {
  HEARSAY_CHECK(batch >= 1 && batch <= max_batch_, "batch " + std::to_string(batch) + " outside [1, max_batch]");
  const float* in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(backend_, params() + layer_offsets_[i], in, acts_[i].f32(), batch);
    in = acts_[i].f32();
  }
}

BatchStats Model::forward_backward(const float* x, const int32_t* labels, int batch) {
  forward(x, batch);
  const size_t last = layers_.size() - 1;
  backend_.softmax_cross_entropy(acts_[last].f32(), labels, batch, spec_.num_classes, 1.0f / batch,
                                 dacts_[last].f32(), stats_.f32());
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* in = i == 0 ? x : acts_[i - 1].f32();
    float* din = i == 0 ? nullptr : dacts_[i - 1].f32();
    layers_[i]->backward(backend_, params() + layer_offsets_[i], grads() + layer_offsets_[i], in,
                         acts_[i].f32(), dacts_[i].f32(), din, batch);
  }
  float stats[2];
  backend_.download(stats, stats_.data(), sizeof(stats));
  return BatchStats{stats[0], static_cast<int64_t>(stats[1]), batch};
}

BatchStats Model::evaluate(const float* x, const int32_t* labels, int batch) {
  forward(x, batch);
  const size_t last = layers_.size() - 1;
  backend_.softmax_cross_entropy(acts_[last].f32(), labels, batch, spec_.num_classes, 1.0f,
                                 dacts_[last].f32(), stats_.f32());
  float stats[2];
  backend_.download(stats, stats_.data(), sizeof(stats));
  return BatchStats{stats[0], static_cast<int64_t>(stats[1]), batch};
}

std::vector<float> Trainable::get_params() const { return download_floats(backend(), params(), num_params()); }

void Trainable::set_params(const std::vector<float>& host) {
  HEARSAY_CHECK(host.size() == num_params(), "set_params: " + std::to_string(host.size()) + " floats for a model of " +
                                                 std::to_string(num_params()));
  backend().upload(params(), host.data(), sizeof(float) * host.size());
}

double Model::gemm_flops_per_sample() const {
  double f = 0.0;
  for (size_t i = 0; i < layers_.size(); ++i) f += layers_[i]->gemm_flops_per_sample(i > 0);
  return f;
}

std::string Model::summary() const {
  std::ostringstream out;
  for (const auto& layer : layers_) {
    out << layer->name() << " " << layer->input_shape().str() << " -> " << layer->output_shape().str()
        << " (" << layer->param_count() << " params)\n";
  }
  out << "total " << num_params_ << " params";
  return out.str();
}

}  // namespace hearsay

namespace hearsay {

std::unique_ptr<Trainable> create_model(const ModelSpec& spec, Backend& backend, int max_batch, uint64_t seed) {
  switch (spec.kind) {
    case ModelSpec::Kind::kLogReg:
    case ModelSpec::Kind::kMlp:
    case ModelSpec::Kind::kCnn:
      return std::make_unique<Model>(spec, backend, max_batch, seed);
    case ModelSpec::Kind::kGpt:
      return std::make_unique<Gpt>(spec.gpt, backend, max_batch, seed);
  }
  throw InputError("model: unknown kind");
}

}  // namespace hearsay
