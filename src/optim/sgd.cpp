#include "hearsay/error.h"
#include "hearsay/optim.h"

namespace hearsay {

const char* optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

Sgd::Sgd(Backend& backend, size_t n, SgdParams params) : backend_(backend), n_(n), params_(params) {
  switch (params_.kind) {
    case OptimizerKind::kSgd:
      if (params_.momentum != 0.0f) velocity_ = DeviceBuffer(backend_, sizeof(float) * n);
      break;
    case OptimizerKind::kAdamW:
      m_ = DeviceBuffer(backend_, sizeof(float) * n);
      v_ = DeviceBuffer(backend_, sizeof(float) * n);
      break;
  }
}

void Sgd::step(float* w, const float* g, float lr) {
  SgdParams p = params_;
  p.lr = lr;
  ++steps_;
  switch (params_.kind) {
    case OptimizerKind::kSgd: backend_.sgd_update(w, g, velocity_.f32(), n_, p); break;
    case OptimizerKind::kAdamW: backend_.adamw_update(w, g, m_.f32(), v_.f32(), n_, p, steps_); break;
  }
}

namespace {

std::vector<float> download_all(Backend& b, const float* src, size_t n) {
  std::vector<float> out;
  if (src == nullptr) return out;
  out.resize(n);
  b.download(out.data(), src, sizeof(float) * n);
  return out;
}

void upload_checked(Backend& b, float* dst, const std::vector<float>& src, size_t n, const std::string& where,
                    const char* what) {
  if (src.size() != n) {
    throw InputError(where + ": the optimizer's " + what + " holds " + std::to_string(src.size()) +
                     " values, the model has " + std::to_string(n) + " parameters");
  }
  b.upload(dst, src.data(), sizeof(float) * n);
}

}  // namespace

Sgd::State Sgd::state() const {
  State s;
  s.kind = params_.kind;
  s.steps = steps_;
  s.velocity = download_all(backend_, velocity_.f32(), n_);
  s.m = download_all(backend_, m_.f32(), n_);
  s.v = download_all(backend_, v_.f32(), n_);
  return s;
}

void Sgd::restore(const State& s, const std::string& where) {
  if (s.kind != params_.kind) {
    throw InputError(where + ": holds the state of optimizer '" + optimizer_kind_name(s.kind) +
                     "', but this config's optim.kind is '" + optimizer_kind_name(params_.kind) +
                     "'; resume with the same optimizer, or start afresh without this checkpoint");
  }
  if (s.steps < 0) throw InputError(where + ": the optimizer's step count is negative (" + std::to_string(s.steps) + ")");
  switch (params_.kind) {
    case OptimizerKind::kSgd:
      // Saved without momentum (no velocity) or resumed without it: the velocity starts
      // at zero or is not kept.
      if (velocity_.f32() != nullptr && !s.velocity.empty()) {
        upload_checked(backend_, velocity_.f32(), s.velocity, n_, where, "velocity");
      }
      break;
    case OptimizerKind::kAdamW:
      upload_checked(backend_, m_.f32(), s.m, n_, where, "first moment (m)");
      upload_checked(backend_, v_.f32(), s.v, n_, where, "second moment (v)");
      break;
  }
  steps_ = s.steps;
}

}  // namespace hearsay
