// The step suite's GPT cases: tokens per second of one training step (forward, backward,
// AdamW) of the byte-level GPT on one CPU thread, against the sgemm roofline of the
// step's own GEMM shapes and against the same model in PyTorch (bench/torch_gpt.py),
// interleaved round by round in one run.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpt_step_bench.h"
#include "torch_server.h"
#include "hearsay/backend.h"
#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/rng.h"

namespace hearsay::bench {
namespace {

struct Gemm {
  bool ta, tb;
  int m, n, k;
  int count;  // how many times the step runs this shape
};

// Every GEMM of one GPT training step on `rows` sequences (gpt.cpp's calls and the CPU
// attention kernels', which run one head of one sequence at a time, by blocks of queries).
std::vector<Gemm> gpt_gemms(const GptSpec& s, int rows) {
  const int c = s.width, t = s.context, v = s.vocab, n = rows * t, d = c / s.heads, heads = rows * s.heads;
  std::vector<Gemm> g;
  for (int l = 0; l < s.layers; ++l) {
    for (const int out : {3 * c, c, 4 * c}) g.push_back({false, true, n, out, c, 1});  // qkv, proj, fc
    g.push_back({false, true, n, c, 4 * c, 1});                                      // mlp proj
    for (const int out : {3 * c, c, 4 * c}) {
      g.push_back({true, false, out, c, n, 1});   // dW
      g.push_back({false, false, n, c, out, 1});  // dx
    }
    g.push_back({true, false, c, 4 * c, n, 1});
    g.push_back({false, false, n, 4 * c, c, 1});
    // Attention per head, per block of 64 queries [r0, r1) over keys [0, r1)
    // (transformer_kernels.cpp): forward scores and P v; backward the scores again, dV,
    // dP, dQ, dK.
    for (int r0 = 0; r0 < t; r0 += 64) {
      const int r1 = std::min(t, r0 + 64), q = r1 - r0;
      g.push_back({false, true, q, r1, d, 2 * heads});   // scores, twice
      g.push_back({false, false, q, d, r1, heads});      // P v
      g.push_back({true, false, r1, d, q, 2 * heads});   // dV, dK
      g.push_back({false, true, q, r1, d, heads});       // dP
      g.push_back({false, false, q, d, r1, heads});      // dQ
    }
  }
  g.push_back({false, true, n, v, c, 1});   // head
  g.push_back({true, false, v, c, n, 1});   // dwte
  g.push_back({false, false, n, c, v, 1});  // dx
  return g;
}

}  // namespace

void run_gpt_step_case(const std::string& name, const GptSpec& spec, int batch, int repeats, double round_s,
                       bool with_torch, const StepDevice& device) {
  const std::string case_name = name + device.case_suffix();
  auto backend = create_backend(device.name, 1);
  ModelSpec ms;
  ms.kind = ModelSpec::Kind::kGpt;
  ms.gpt = spec;
  auto model = create_model(ms, *backend, batch, 1);
  OptimizerSpec adamw;
  adamw.name = "adamw";
  adamw.weight_decay = 0.1f;
  adamw.beta2 = 0.95f;
  const auto optimizer = create_optimizer(*backend, model->num_params(), adamw);

  // Training windows of the corpus when `make` has written it, else random bytes.
  const std::string text_path = std::string(HEARSAY_SOURCE_DIR) + "/data/kjv.txt";
  std::string data_name = "kjv";
  Dataset text;
  if (std::filesystem::exists(text_path)) {
    text = load_text(text_path, spec.context, 0.02, "").train;
  } else {
    data_name = "random-bytes";
    Rng rng(3);
    text.context = spec.context;
    for (int i = 0; i < 1 << 20; ++i) text.text.push_back(static_cast<uint8_t>(rng.below(256)));
    text.size = static_cast<int64_t>(text.text.size()) - spec.context;
  }
  constexpr int kBatches = 8;
  const size_t tokens = static_cast<size_t>(batch) * spec.context;
  std::vector<DeviceBuffer> xs, ys;
  Rng rng(42);
  std::vector<int64_t> idx(batch);
  std::vector<int32_t> host_x(tokens), host_y(tokens);
  for (int b = 0; b < kBatches; ++b) {
    for (auto& i : idx) i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(text.size)));
    xs.emplace_back(*backend, sizeof(int32_t) * tokens);
    ys.emplace_back(*backend, sizeof(int32_t) * tokens);
    gather_tokens(text, idx.data(), batch, host_x.data(), host_y.data());
    backend->upload(xs.back().data(), host_x.data(), sizeof(int32_t) * tokens);
    backend->upload(ys.back().data(), host_y.data(), sizeof(int32_t) * tokens);
  }
  int which = 0;
  auto step = [&] {
    model->forward_backward(Batch{xs[which].data(), ys[which].i32(), batch});
    optimizer->step(model->params(), model->grads(), 1e-3f);
    which = (which + 1) % kBatches;
  };

  const std::vector<Gemm> gemms = gpt_gemms(spec, batch);
  size_t biggest = 0;
  double flops = 0;
  for (const auto& g : gemms) {
    biggest = std::max({biggest, size_t(g.m) * g.k, size_t(g.k) * g.n, size_t(g.m) * g.n});
    flops += 2.0 * g.m * g.n * g.k * g.count;
  }
  DeviceBuffer a(*backend, sizeof(float) * biggest), bb(*backend, sizeof(float) * biggest),
      cc(*backend, sizeof(float) * biggest);
  fill_pattern(*backend, a);
  fill_pattern(*backend, bb);
  auto gemm_pass = [&] {
    for (const auto& g : gemms) {
      const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
      for (int r = 0; r < g.count; ++r) {
        backend->gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.f32(), lda, bb.f32(), ldb, 0.0f, cc.f32(), g.n);
      }
    }
  };

  std::vector<std::function<double(int)>> bodies{timed_on(*backend, step), timed_on(*backend, gemm_pass)};
  std::string blas, why;
  const std::vector<std::string> torch_args{
      "--layers", std::to_string(spec.layers), "--heads", std::to_string(spec.heads), "--width", std::to_string(spec.width),
      "--context", std::to_string(spec.context), "--batch", std::to_string(batch), "--text", data_name == "kjv" ? text_path : "",
      "--device", device.torch_name()};
  std::unique_ptr<LineProcess> torch = with_torch ? start_torch_server("torch_gpt.py", torch_args, &blas, &why) : nullptr;
  bool torch_failed = false;
  if (torch) bodies.push_back(torch_steps(*torch, &torch_failed));
  const auto rounds = time_interleaved(bodies, repeats, round_s);
  const double step_s = median(rounds[0]);
  std::vector<double> fraction, speedup, torch_fraction;
  for (int r = 0; r < repeats; ++r) {
    fraction.push_back(rounds[1][r] / rounds[0][r]);
    if (torch && !torch_failed) {
      speedup.push_back(rounds[2][r] / rounds[0][r]);
      torch_fraction.push_back(rounds[1][r] / rounds[2][r]);
    }
  }
  JsonObject extra;
  extra.add("data", data_name).add("device", backend->name()).add("threads", 1).add("repeats", repeats).add("params", static_cast<int64_t>(model->num_params()));
  emit("step", case_name, "tokens_per_s", tokens / step_s, "tokens/s", &extra);
  emit("step", case_name, "step_gflops", flops / step_s / 1e9, "GFLOP/s");
  // The roofline's GEMMs are the CPU kernels' (attention one head and block of queries at
  // a time); a GPU runs attention batched over heads, so on a GPU it bounds nothing.
  const bool roofline = backend->is_host();
  if (roofline) {
    emit("step", case_name, "sgemm_gflops", flops / median(rounds[1]) / 1e9, "GFLOP/s");
    emit("step", case_name, "roofline_fraction", median(fraction), "ratio");
  }
  if (torch && !torch_failed) {
    JsonObject t;
    t.add("blas", blas);
    emit("step", case_name, "torch_tokens_per_s", tokens / median(rounds[2]), "tokens/s", &t);
    if (roofline) emit("step", case_name, "torch_roofline_fraction", median(torch_fraction), "ratio");
    emit("step", case_name, "speedup_vs_torch", median(speedup), "ratio");
  } else if (with_torch) {
    JsonObject t;
    t.add("suite", "step").add("case", case_name)
        .add("note", "pytorch unavailable: " + (torch_failed ? std::string("it stopped answering") : why));
    std::printf("%s\n", t.str().c_str());
  }
}

}  // namespace hearsay::bench
