// The private layer interface behind Model. A layer reads its parameters from, and writes
// its gradients to, its own slice of the model's flat buffers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/rng.h"

namespace hearsay {

struct Shape {
  int h = 1, w = 1, c = 1;
  size_t size() const { return static_cast<size_t>(h) * w * c; }
  std::string str() const;
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;

  const std::string& name() const { return name_; }
  virtual Shape input_shape() const = 0;
  virtual Shape output_shape() const = 0;
  // Parameter tensors in layout order: (suffix, shape).
  virtual std::vector<std::pair<std::string, std::vector<int>>> param_shapes() const { return {}; }
  size_t param_count() const;
  // Writes param_count() initial values to host memory.
  virtual void init(float* host_params, Rng& rng) const {}
  // Allocates scratch for up to max_batch samples.
  virtual void prepare(Backend& backend, int max_batch) {}
  virtual void forward(Backend& b, const float* params, const float* x, float* y, int batch) = 0;
  // dy: gradient w.r.t. y, may be overwritten. Writes (not accumulates) this layer's
  // gradients, and dx when it is not null.
  virtual void backward(Backend& b, const float* params, float* grads, const float* x,
                        const float* y, float* dy, float* dx, int batch) = 0;
  virtual double gemm_flops_per_sample(bool need_dx) const { return 0.0; }

 private:
  std::string name_;
};

}  // namespace hearsay
