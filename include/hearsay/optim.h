// The local optimizer: the rule that turns a step's gradient into a parameter update over
// a model's flat buffers, chosen by name from a registry ("sgd", "adamw"; each is its own
// file in src/optim, and src/optim/registry.cpp is the one list of them); and the
// learning-rate schedule, kept apart from it, that gives every step its rate.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/registry.h"

namespace hearsay {

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  float base_lr = 0.05f;
  int64_t warmup_steps = 0;  // linear ramp from base_lr/warmup_steps up to base_lr
  int64_t step_size = 0;     // kStep: multiply by gamma every step_size steps
  float gamma = 0.1f;
  int64_t total_steps = 0;  // kCosine: decay from base_lr to min_lr over total_steps
  float min_lr = 0.0f;

  // Learning rate for the given 0-based step.
  float at(int64_t step) const;
};

// Which optimizer, and every hyper-parameter one may read. Each optimizer reads the
// fields that apply to it and ignores the others, so one config block serves them all
// (as CodecSpec does for codecs); a new optimizer adds its own fields here.
struct OptimizerSpec {
  std::string name = "sgd";  // a name optimizers() lists
  float momentum = 0.0f;     // sgd: in [0, 1)
  bool nesterov = false;     // sgd: needs momentum > 0
  // sgd adds weight_decay * w to the gradient; adamw decays decoupled from it.
  float weight_decay = 0.0f;
  float beta1 = 0.9f;  // adamw: the moments' decay rates, in [0, 1)
  float beta2 = 0.999f;
  float eps = 1e-8f;  // adamw: added to the denominator sqrt(v), > 0
  // Every optimizer: > 0 clips each step's gradient to this global L2 norm (0: never).
  float grad_clip_norm = 0.0f;
};

// An optimizer's state on the host, as a checkpoint keeps it: the name of the optimizer
// that saved it, the steps it had taken, and its buffers by name (sgd: "velocity" when it
// has momentum; adamw: "m" and "v"), each of the model's parameter count.
struct OptimizerState {
  std::string optimizer;
  int64_t steps = 0;
  std::map<std::string, std::vector<float>> buffers;
};

// The local optimizer of one peer, over n parameters on one backend. Its state (momentum
// buffers, moments) lives on that backend, allocated at construction and zero; the
// backend must outlive it. Used from the peer's step loop only, like the backend.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Its registry name: "sgd", "adamw".
  virtual const std::string& name() const = 0;
  // One update of w (n floats on the backend) from the gradient g, with learning rate
  // `lr` (the schedule's rate for this step; the optimizer keeps no rate of its own).
  virtual void step(float* w, const float* g, float lr) = 0;
  // The same update from the gradient read as g x grad_scale, as it is read: global-norm
  // clipping without a model-sized scaled copy of the gradient. False (nothing done) where
  // this optimizer cannot: the caller scales a copy and calls step.
  virtual bool step_scaled(float* w, const float* g, float lr, float grad_scale) {
    (void)w, (void)g, (void)lr, (void)grad_scale;
    return false;
  }
  // Steps taken since construction, or since the state load_state() restored.
  virtual int64_t steps() const = 0;

  // Downloads the state (synchronizes the backend).
  virtual OptimizerState save_state() const = 0;
  // The same into `into`, reusing the memory of its buffers that have the right length (a
  // checkpoint's snapshot, taken into the last one's buffers).
  virtual void save_state_into(OptimizerState& into) const { into = save_state(); }
  // The names of the buffers save_state() gives (each num_params floats): what a
  // checkpoint's snapshot makes room for before its first copy.
  virtual std::vector<std::string> state_buffer_names() const { return {}; }
  // What save_state_into gives, without its copies: the optimizer's name and step count
  // set in `into` (its buffers left as they are), and where each buffer lives on the
  // backend, by the same names. A checkpoint of a host peer reads them from there until
  // the next step (src/peer/live_snapshot.h). nullopt where this optimizer cannot.
  virtual std::optional<std::map<std::string, const float*>> save_state_live(OptimizerState& into) const {
    (void)into;
    return std::nullopt;
  }
  // Uploads a state save_state() gave. Throws InputError, naming `where` (a checkpoint
  // file), when it is another optimizer's, or holds a buffer this optimizer does not
  // keep, or one whose length is not n, or a negative step count; nothing is changed
  // then.
  virtual void load_state(const OptimizerState& state, const std::string& where) = 0;
  // Whether save_state() holds all of the state its steps depend on (false: another
  // framework keeps it, as a torch optimizer does), so that a copy loaded elsewhere steps
  // as this one would.
  virtual bool state_is_saved() const { return true; }
  // Bytes of the backend's memory this optimizer's own state holds (momentum, moments; a
  // clip's copy of the gradient): the `optimizer` owner of a memory event.
  virtual uint64_t state_bytes() const { return 0; }
};

// Makes an optimizer for n parameters on a backend from a spec whose name is its own.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(Backend& backend, size_t n,
                                                                  const OptimizerSpec& spec)>;

// The one list of optimizers (hearsay/registry.h): hearsay's own, sgd and adamw, and any a
// program or a test adds with optimizers().add(name, factory); from then on configs may
// name it.
NamedRegistry<OptimizerFactory>& optimizers();
// Creates the optimizer spec.name names for n parameters on `backend`. Throws InputError
// when the name is not registered (listing those that are) or a hyper-parameter it reads
// is out of range (naming the field).
// With spec.grad_clip_norm > 0 the optimizer comes wrapped in clip_gradient_norm().
std::unique_ptr<Optimizer> create_optimizer(Backend& backend, size_t n, const OptimizerSpec& spec);
// `inner`, stepping with the gradient scaled to at most max_norm in L2 norm (the caller's
// gradient buffer is not changed). Throws InputError unless max_norm is positive.
std::unique_ptr<Optimizer> clip_gradient_norm(std::unique_ptr<Optimizer> inner, Backend& backend, size_t n,
                                              float max_norm);

}  // namespace hearsay
