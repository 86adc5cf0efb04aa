#include "hearsay/optim.h"

namespace hearsay {

Sgd::Sgd(Backend& backend, size_t n, SgdParams params) : backend_(backend), n_(n), params_(params) {
  if (params_.momentum != 0.0f) velocity_ = DeviceBuffer(backend_, sizeof(float) * n);
}

void Sgd::step(float* w, const float* g, float lr) {
  SgdParams p = params_;
  p.lr = lr;
  backend_.sgd_update(w, g, velocity_.f32(), n_, p);
}

}  // namespace hearsay
