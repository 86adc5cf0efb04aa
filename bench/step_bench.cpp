// The step suite: training-step throughput of the MLP 784-256-256-10 on one CPU thread,
// the sgemm roofline of the same GEMM shapes, and PyTorch on the same model, batch and
// data, measured in the same run (bench/torch_step.py).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "hearsay/backend.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/rng.h"

namespace hearsay::bench {
namespace {

struct Options {
  std::vector<int> batches{64, 256};
  int repeats = 7;
  double round_s = 0.5;
  bool torch = true;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError("step bench: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--batches") {
      o.batches.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.batches.push_back(std::stoi(item));
    } else if (a == "--repeats") {
      o.repeats = std::stoi(next());
    } else if (a == "--round-s") {
      o.round_s = std::stod(next());
    } else if (a == "--no-torch") {
      o.torch = false;
    } else {
      throw InputError("step bench: unknown option '" + a + "'");
    }
  }
  return o;
}

// Runs PyTorch's step on the same model and batch; returns samples/s or < 0.
double torch_samples_per_s(int batch, const Options& o, std::string* note) {
  const std::string script = std::string(HEARSAY_SOURCE_DIR) + "/bench/torch_step.py";
  const std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + script + " --batch " + std::to_string(batch) +
                          " --repeats " + std::to_string(o.repeats) + " --round-s " + std::to_string(o.round_s) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *note = "could not start python";
    return -1;
  }
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = pclose(p);
  const auto pos = out.find("\"samples_per_s\":");
  if (status != 0 || pos == std::string::npos) {
    *note = out.substr(0, 300);
    return -1;
  }
  const auto blas = out.find("\"blas\":\"");
  if (blas != std::string::npos) *note = out.substr(blas + 8, out.find('"', blas + 8) - blas - 8);
  return std::atof(out.c_str() + pos + 16);
}

}  // namespace

int run_step_bench(int argc, char** argv) {
  const Options o = parse(argc, argv);
  auto backend = create_backend("cpu", 1);

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
    const std::string case_name = model_name + "/b" + std::to_string(batch);
    Model model(spec, *backend, batch, 1);
    Sgd sgd(*backend, model.num_params(), SgdParams{0.05f, 0.9f, 0.0f, true});

    // Pre-gathered batches, cycled: the step alone is timed, as in torch_step.py.
    constexpr int kBatches = 32;
    std::vector<DeviceBuffer> xs, ys;
    Rng rng(42);
    std::vector<int64_t> idx(batch);
    for (int b = 0; b < kBatches; ++b) {
      for (auto& i : idx) i = static_cast<int64_t>(rng.below(data.size));
      xs.emplace_back(*backend, sizeof(float) * batch * data.dim());
      ys.emplace_back(*backend, sizeof(int32_t) * batch);
      gather_batch(data, idx.data(), batch, xs.back().f32(), ys.back().i32());
    }
    int which = 0;
    const auto step_times = time_rounds(
        [&] {
          model.forward_backward(xs[which].f32(), ys[which].i32(), batch);
          sgd.step(model.params(), model.grads(), 0.05f);
          which = (which + 1) % kBatches;
        },
        o.repeats, o.round_s);
    const double step_s = median(step_times);
    const double samples_per_s = batch / step_s;

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
    for (size_t i = 0; i < biggest; ++i) a.f32()[i] = b.f32()[i] = 0.01f * static_cast<float>(i % 97);
    const auto gemm_times = time_rounds(
        [&] {
          for (const auto& g : gemms) {
            const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
            backend->gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.f32(), lda, b.f32(), ldb, 0.0f, c.f32(), g.n);
          }
        },
        o.repeats, o.round_s);
    const double gemm_s = median(gemm_times);
    const double roofline = batch / gemm_s;

    JsonObject extra;
    extra.add("data", data_name).add("threads", 1).add("repeats", o.repeats);
    emit("step", case_name, "samples_per_s", samples_per_s, "samples/s", &extra);
    emit("step", case_name, "step_gflops", flops / step_s / 1e9, "GFLOP/s");
    emit("step", case_name, "sgemm_gflops", flops / gemm_s / 1e9, "GFLOP/s");
    emit("step", case_name, "roofline_samples_per_s", roofline, "samples/s");
    emit("step", case_name, "roofline_fraction", samples_per_s / roofline, "ratio");
    if (o.torch) {
      std::string note;
      const double torch = torch_samples_per_s(batch, o, &note);
      if (torch > 0) {
        JsonObject t;
        t.add("blas", note);
        emit("step", case_name, "torch_samples_per_s", torch, "samples/s", &t);
        emit("step", case_name, "torch_roofline_fraction", torch / roofline, "ratio");
        emit("step", case_name, "speedup_vs_torch", samples_per_s / torch, "ratio");
      } else {
        JsonObject t;
        t.add("note", "pytorch unavailable: " + note);
        std::printf("%s\n", t.str().c_str());
      }
    }
  }
  return 0;
}

}  // namespace hearsay::bench
