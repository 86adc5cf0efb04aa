// hearsay's AdamW against torch.optim.AdamW, step for step: the parameters and both
// moments after each of six steps, for several rates, betas, eps and weight decays
// (tests/optim/adamw_reference.py wrote the values once with PyTorch). On the CPU backend
// always, on the CUDA backend where a GPU is present.
#include "adamw_reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hearsay/build_config.h"
#include "hearsay/optim.h"
#include "test_skip.h"

using namespace hearsay;
namespace ref = hearsay::test::adamw_reference;

namespace {

// PyTorch computes sqrt(v) / sqrt(c2) and (lr / c1) * m where hearsay computes sqrt(v / c2)
// and lr * (m / c1), and each rounds its own way: a few float32 ulps apart per step.
constexpr double kRelativeTolerance = 1e-6;

// Runs every reference case through the optimizer the registry makes on `device`.
void check_against_pytorch(const std::string& device) {
  auto backend = create_backend(device, 1);
  for (const ref::Case& c : ref::kCases) {
    const std::string name = c.name;
    CAPTURE(device);
    CAPTURE(name);
    OptimizerSpec spec;
    spec.name = "adamw";
    spec.beta1 = c.beta1;
    spec.beta2 = c.beta2;
    spec.eps = c.eps;
    spec.weight_decay = c.weight_decay;
    auto opt = create_optimizer(*backend, ref::kParams, spec);
    DeviceBuffer w(*backend, sizeof(float) * ref::kParams),
        g(*backend, sizeof(float) * ref::kParams);
    backend->upload(w.data(), c.w0, sizeof(c.w0));
    double worst = 0;
    for (int s = 0; s < ref::kSteps; ++s) {
      CAPTURE(s + 1);
      backend->upload(g.data(), c.grad[s], sizeof(c.grad[s]));
      opt->step(w.f32(), g.f32(), c.lr[s]);
      std::vector<float> got_w(ref::kParams);
      backend->download(got_w.data(), w.f32(), sizeof(float) * ref::kParams);
      const OptimizerState state = opt->save_state();
      CHECK(state.steps == s + 1);
      const auto& got_m = state.buffers.at("m");
      const auto& got_v = state.buffers.at("v");
      for (int i = 0; i < ref::kParams; ++i) {
        CAPTURE(i);
        // Relative to the reference itself: a moment that is exactly 0 in PyTorch (a
        // gradient that was always 0) must be exactly 0 here too.
        auto off = [](float got, float want) {
          return std::abs(double(got) - want) / std::abs(double(want));
        };
        CHECK(std::abs(double(got_w[i]) - c.w[s][i]) <=
              kRelativeTolerance * std::abs(double(c.w[s][i])));
        CHECK(std::abs(double(got_m[i]) - c.m[s][i]) <=
              kRelativeTolerance * std::abs(double(c.m[s][i])));
        CHECK(std::abs(double(got_v[i]) - c.v[s][i]) <=
              kRelativeTolerance * std::abs(double(c.v[s][i])));
        worst = std::max({worst, off(got_w[i], c.w[s][i]),
                          c.m[s][i] != 0 ? off(got_m[i], c.m[s][i]) : 0.0,
                          c.v[s][i] != 0 ? off(got_v[i], c.v[s][i]) : 0.0});
      }
    }
    MESSAGE(device << ", " << name << ": worst relative difference from PyTorch " << worst);
  }
}

}  // namespace

TEST_CASE(
    "adamw reference: the cpu backend's AdamW matches torch.optim.AdamW step for step to 1e-6") {
  check_against_pytorch("cpu");
}

TEST_CASE(
    "adamw reference: the cuda backend's AdamW matches torch.optim.AdamW step for step to 1e-6") {
  std::vector<std::string> gpus;
  for (const auto& d : available_devices()) {
    if (d != "cpu") gpus.push_back(d);
  }
  if (gpus.empty()) {
    HEARSAY_SKIP(HEARSAY_HAVE_CUDA ? "the CUDA backend is built but no CUDA device is visible"
                                   : "this build has no CUDA backend");
  }
  for (const auto& d : gpus) check_against_pytorch(d);
}
