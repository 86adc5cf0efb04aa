// The step suite: training-step throughput of the MLP 784-256-256-10 on one CPU thread
// (or a GPU with --device cuda:N), the sgemm roofline of the same GEMM shapes, and PyTorch
// on the same model, batch, data and device, measured in the same run
// (bench/torch_step.py); then the GPT at two sizes (gpt_step_bench.cpp).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpt_step_bench.h"
#include "torch_server.h"
#include "hearsay/backend.h"
#include "hearsay/command_line.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/rng.h"

namespace hearsay::bench {
namespace {

struct Options {
  std::vector<std::string> models{"mlp", "gpt-0.8m", "gpt-10m"};
  std::vector<int> batches{64, 256};
  int repeats = 7;
  double round_s = 0.5;
  bool torch = true;
  std::string device = "cpu";
};

Options parse(int argc, char** argv) {
  Options o;
  CommandLine("step bench")
      .text_list("--models", &o.models, "a list of mlp, gpt-0.8m, gpt-10m")
      .integer_list("--batches", &o.batches, 1, 1 << 16, "a list of batch sizes (the MLP's)")
      .integer("--repeats", &o.repeats, 1, 1000, "a number of rounds")
      .number("--round-s", &o.round_s, 1e-3, 3600, "a number of seconds")
      .text("--device", &o.device, "cpu or cuda:N")
      .flag({"--no-torch"}, [&o] { o.torch = false; })
      .parse(argc, argv, 0);
  return o;
}

}  // namespace

void run_mlp_cases(const Options& o);

int run_step_bench(int argc, char** argv) {
  const Options o = parse(argc, argv);
  for (const std::string& m : o.models) {
    if (m != "mlp" && m != "gpt-0.8m" && m != "gpt-10m") {
      throw UsageError("step bench: --models: unknown model '" + m + "' (mlp, gpt-0.8m, gpt-10m)");
    }
  }
  for (const std::string& m : o.models) {
    if (m == "mlp") run_mlp_cases(o);
    // The two sizes, 2048 tokens a step each.
    const StepDevice device{o.device};
    if (m == "gpt-0.8m") {
      run_gpt_step_case("gpt-l4-w128-h4-t128/b16", GptSpec{.vocab = 256, .context = 128, .layers = 4, .heads = 4, .width = 128},
                        16, o.repeats, o.round_s, o.torch, device);
    }
    if (m == "gpt-10m") {
      run_gpt_step_case("gpt-l6-w384-h6-t256/b8", GptSpec{.vocab = 256, .context = 256, .layers = 6, .heads = 6, .width = 384},
                        8, o.repeats, o.round_s, o.torch, device);
    }
  }
  return 0;
}

void run_mlp_cases(const Options& o) {
  const StepDevice device{o.device};
  auto backend = create_backend(device.name, 1);

  Dataset data;
  std::string data_name = "fashion-mnist";
  try {
    data = load_mnist_dir(kFashionMnistDir, "fashion-mnist").train;
  } catch (const InputError&) {
    data = make_synthetic(8192, 1, 784, 10, 1.0f, 1).train;
    data_name = "synthetic-784";
  }

  ModelSpec spec;
  spec.kind = ModelSpec::Kind::kMlp;
  spec.channels = data.dim();
  spec.hidden = {256, 256};
  spec.num_classes = 10;
  const std::string model_name = "mlp784-256-256-10";

  for (const int batch : o.batches) {
    const std::string case_name = model_name + "/b" + std::to_string(batch) + device.case_suffix();
    Model model(spec, *backend, batch, 1);
    OptimizerSpec sgd_spec;
    sgd_spec.momentum = 0.9f;
    sgd_spec.nesterov = true;
    const auto optimizer = create_optimizer(*backend, model.num_params(), sgd_spec);

    // Pre-gathered batches, cycled: the step alone is timed, as in torch_step.py.
    constexpr int kBatches = 32;
    std::vector<DeviceBuffer> xs, ys;
    Rng rng(42);
    std::vector<int64_t> idx(batch);
    std::vector<float> host_x(static_cast<size_t>(batch) * data.dim());
    std::vector<int32_t> host_y(batch);
    for (int b = 0; b < kBatches; ++b) {
      for (auto& i : idx) i = static_cast<int64_t>(rng.below(data.size));
      xs.emplace_back(*backend, sizeof(float) * host_x.size());
      ys.emplace_back(*backend, sizeof(int32_t) * batch);
      gather_batch(data, idx.data(), batch, host_x.data(), host_y.data());
      backend->upload(xs.back().data(), host_x.data(), sizeof(float) * host_x.size());
      backend->upload(ys.back().data(), host_y.data(), sizeof(int32_t) * batch);
    }
    int which = 0;
    auto step = [&] {
      model.forward_backward(xs[which].f32(), ys[which].i32(), batch);
      optimizer->step(model.params(), model.grads(), 0.05f);
      which = (which + 1) % kBatches;
    };

    // The roofline: the step's own GEMMs, same shapes, back to back with nothing else.
    struct Gemm { bool ta, tb; int m, n, k; };
    std::vector<Gemm> gemms;
    const int dims[] = {data.dim(), 256, 256, 10};
    for (int l = 0; l < 3; ++l) {
      const int in = dims[l], out = dims[l + 1];
      gemms.push_back({false, true, batch, out, in});   // forward
      gemms.push_back({true, false, out, in, batch});   // weight gradient
      if (l > 0) gemms.push_back({false, false, batch, in, out});  // input gradient
    }
    size_t biggest = 0;
    double flops = 0;
    for (const auto& g : gemms) {
      biggest = std::max({biggest, size_t(g.m) * g.k, size_t(g.k) * g.n, size_t(g.m) * g.n});
      flops += 2.0 * g.m * g.n * g.k;
    }
    DeviceBuffer a(*backend, sizeof(float) * biggest), b(*backend, sizeof(float) * biggest), c(*backend, sizeof(float) * biggest);
    fill_pattern(*backend, a);
    fill_pattern(*backend, b);
    auto gemm_pass = [&] {
      for (const auto& g : gemms) {
        const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
        backend->gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.f32(), lda, b.f32(), ldb, 0.0f, c.f32(), g.n);
      }
    };

    std::vector<std::function<double(int)>> bodies{timed_on(*backend, step), timed_on(*backend, gemm_pass)};
    std::string blas, why;
    // PyTorch's step on the same model, batch, data and device.
    std::unique_ptr<LineProcess> torch =
        o.torch ? start_torch_server("torch_step.py", {"--batch", std::to_string(batch), "--device", device.torch_name()}, &blas, &why)
                : nullptr;
    bool torch_failed = false;
    if (torch) bodies.push_back(torch_steps(*torch, &torch_failed));
    const auto rounds = time_interleaved(bodies, o.repeats, o.round_s);
    const double step_s = median(rounds[0]);
    const double gemm_s = median(rounds[1]);
    const double samples_per_s = batch / step_s;
    const double roofline = batch / gemm_s;
    // Ratios per round (same noise), then their median.
    std::vector<double> fraction, speedup;
    for (int r = 0; r < o.repeats; ++r) {
      fraction.push_back(rounds[1][r] / rounds[0][r]);
      if (torch && !torch_failed) speedup.push_back(rounds[2][r] / rounds[0][r]);
    }

    JsonObject extra;
    extra.add("data", data_name).add("device", backend->name()).add("threads", 1).add("repeats", o.repeats);
    emit("step", case_name, "samples_per_s", samples_per_s, "samples/s", &extra);
    emit("step", case_name, "step_gflops", flops / step_s / 1e9, "GFLOP/s");
    emit("step", case_name, "sgemm_gflops", flops / gemm_s / 1e9, "GFLOP/s");
    emit("step", case_name, "roofline_samples_per_s", roofline, "samples/s");
    emit("step", case_name, "roofline_fraction", median(fraction), "ratio");
    if (torch && !torch_failed) {
      const double torch_sps = batch / median(rounds[2]);
      JsonObject t;
      t.add("blas", blas);
      emit("step", case_name, "torch_samples_per_s", torch_sps, "samples/s", &t);
      std::vector<double> torch_fraction;
      for (int r = 0; r < o.repeats; ++r) torch_fraction.push_back(rounds[1][r] / rounds[2][r]);
      emit("step", case_name, "torch_roofline_fraction", median(torch_fraction), "ratio");
      emit("step", case_name, "speedup_vs_torch", median(speedup), "ratio");
    } else if (o.torch) {
      JsonObject t;
      t.add("suite", "step").add("case", case_name).add("note", "pytorch unavailable: " + (torch_failed ? std::string("it stopped answering") : why));
      std::printf("%s\n", t.str().c_str());
    }
  }
}

}  // namespace hearsay::bench
