// The least memory a simulated run holds (docs/SIMULATION.md, "Memory"), checked against what
// this machine or its cgroup has before anything is allocated.
#include "simulation_memory.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/data.h"
#include "../peer/algorithm_registry.h"

namespace hearsay {
namespace {

// What a simulated run holds at least (docs/SIMULATION.md, "Memory"): besides the
// model-sized buffers, each peer's SimGrid host, actor, interface links, clock, log and
// transport (about 29 KiB measured at 500-3,000 peers of a 132-parameter model; 16 KiB
// counted), and each peer's view of every other (its name in every peer's list, their
// per-neighbour state: about 160 bytes a pair measured; 128 counted).
constexpr double kPeerBytes = 16 << 10;
constexpr double kPairBytes = 128;

// Bytes as an error shows them: 31.3 TiB, 512.0 MiB.
std::string bytes_text(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  char out[48];
  std::snprintf(out, sizeof out, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return out;
}

// The model's parameters, from what the config says of the data's shape. Where it does
// not say (an IDX directory other than Fashion-MNIST's, LIBSVM features to be inferred,
// text), the least it could be: the count is never above the model's. `features`: one
// sample's input values (a GPT's: its context's tokens).
double model_params_at_least(const config::Config& c, double* features) {
  const auto& m = c.model();
  const auto& d = c.data();
  double height = 1, width = 1, channels = 1, classes = 2;
  switch (d.format()) {
    case config::DataConfig::IDX:
      if (d.dir() == kFashionMnistDir) {
        height = width = 28;
        classes = 10;
      }
      break;
    case config::DataConfig::LIBSVM:
      channels = std::max(1, d.num_features());
      classes = std::max(2, d.num_classes());
      break;
    case config::DataConfig::SYNTHETIC:
      channels = std::max(1, d.synthetic_dim());
      classes = d.num_classes() > 0 ? std::max(2, d.num_classes()) : 10;  // as load_data reads it
      break;
    default:
      break;
  }
  *features = height * width * channels;
  switch (m.kind()) {
    case config::ModelConfig::GPT: {
      // Embeddings of the 256 bytes and of the positions, and per layer at least its
      // attention (4 w^2) and MLP (8 w^2) matrices.
      const double w = std::max(1, m.gpt().width()), context = std::max(1, m.gpt().context());
      *features = context;
      return 256 * w + context * w + std::max(0, m.gpt().layers()) * 12 * w * w;
    }
    case config::ModelConfig::LOGREG:
      return (*features + 1) * classes;
    case config::ModelConfig::MLP: {
      double in = *features, n = 0;
      for (const int h : m.hidden()) {
        n += (in + 1) * h;
        in = h;
      }
      return n + (in + 1) * classes;
    }
    case config::ModelConfig::CNN: {
      // The model's default channels where the config names none (model/conv's).
      static constexpr int kDefaultChannels[] = {16, 32};
      const bool given = m.conv_channels_size() > 0;
      const int layers = given ? m.conv_channels_size() : 2;
      const double k2 = static_cast<double>(m.kernel()) * m.kernel();
      double in = channels, n = 0;
      for (int l = 0; l < layers; ++l) {
        const int out = given ? m.conv_channels(l) : kDefaultChannels[l];
        n += in * out * k2 + out;
        in = out;
        height = std::max(1.0, std::floor(height / 2));
        width = std::max(1.0, std::floor(width / 2));
      }
      return n + (height * width * in + 1) * m.fc_width() + (m.fc_width() + 1.0) * classes;
    }
    default:
      return 0;
  }
}

// Model-sized buffers of the configured optimizer's state: AdamW's two moments, SGD's
// momentum when it has one.
int optimizer_buffers(const config::Config& c) {
  const std::string optimizer = optimizer_name(c.optim());
  return optimizer == "adamw" ? 2 : c.optim().momentum() > 0 ? 1 : 0;
}

// The memory a simulation may take: this machine's physical memory, or the limit of the
// cgroup this process runs in (a container's) when that is lower; 0 when unknown.
double memory_limit_bytes(std::string* what) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  double limit = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  *what = "this machine's physical memory";
  // cgroup v2, then v1, as a container sees its own ("max" or a huge number: no limit).
  for (const char* file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(file);
    double v = 0;
    if (in >> v && v > 0 && (limit <= 0 || v < limit)) {
      limit = v;
      *what = std::string("the memory limit of this process's cgroup (") + file + ")";
    }
  }
  return limit;
}

// A simulated run's peers all live in this process: refused when what they hold at least
// (each peer's model-sized buffers, batch, shard and view of the cluster, and the data
// set, held once) is more than the memory there is, before anything is allocated (100,000
// peers once ran 89 s into std::bad_alloc).
}  // namespace

std::string simulation_memory_problem(const config::Config& c) {
  const double n = c.cluster().peers_size();
  if (n < 2) return "";
  double features = 1;
  const double params = model_params_at_least(c, &features);
  // Parameters, gradients, the model or update being mixed, and the optimizer's state.
  const double buffers = 3 + optimizer_buffers(c);
  const auto& d = c.data();
  double train = 0, test = 0;
  if (d.format() == config::DataConfig::SYNTHETIC) {
    train = static_cast<double>(d.synthetic_train());
    test = static_cast<double>(d.synthetic_test());
  } else if (d.format() == config::DataConfig::IDX && d.dir() == kFashionMnistDir) {
    train = 60000;
    test = 10000;
  }
  const double shared = (train + test) * (features * 4 + 4);
  const double model_bytes = buffers * params * 4;
  const double per_peer = model_bytes + c.train().batch_size() * features * 4 + train / n * 8 + kPeerBytes + kPairBytes * n;
  const double need = n * per_peer + shared;
  std::string limit_is;
  const double limit = memory_limit_bytes(&limit_is);
  if (limit <= 0 || need <= limit) return "";
  const std::string per = std::to_string(static_cast<int64_t>(params)) + " parameters x " + std::to_string(static_cast<int>(buffers)) +
                          " model-sized buffers, " + bytes_text(per_peer) + " a peer with its batch and its view of the cluster";
  return std::to_string(c.cluster().peers_size()) + " simulated peers need at least " + bytes_text(need) + " (" + per +
                            (shared > 0 ? ", and " + bytes_text(shared) + " of data held once" : std::string()) + "), more than the " +
                            bytes_text(limit) + " of " + limit_is +
                            "; simulate fewer peers or a smaller model (docs/SIMULATION.md, \"Memory\")";
}

namespace {

// Whether a peer's address names this machine (127.0.0.0/8, ::1, localhost).
bool on_this_machine(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address.rfind("[::1]", 0) == 0 || address.rfind("localhost:", 0) == 0;
}

}  // namespace

std::string peer_memory_problem(const config::Config& c, bool* several) {
  double features = 1;
  const double params = model_params_at_least(c, &features);
  const double optimizer_state = optimizer_buffers(c);
  const bool cluster = c.cluster().peers_size() >= 2;
  const AlgorithmEntry* algorithm = cluster ? find_algorithm(c.cluster().gossip().algorithm()) : nullptr;
  const double algorithm_buffers = algorithm != nullptr ? algorithm->model_buffers : 0;
  // Checkpoints keep a copy of the parameters and the optimizer's state from the first on
  // (src/peer/checkpoint_writer.h: the snapshot the background write takes).
  const double checkpoint = c.checkpoint().dir().empty() ? 0 : 1 + optimizer_state;
  // Parameters and gradient, the optimizer's state, the algorithm's, in a cluster one
  // model or update arriving (decoded, whole), and the checkpoints' snapshot.
  const double buffers = 2 + optimizer_state + algorithm_buffers + (cluster ? 1 : 0) + checkpoint;
  int here = 0;
  for (const auto& p : c.cluster().peers()) here += on_this_machine(p.address()) ? 1 : 0;
  here = std::max(here, 1);
  *several = here > 1;
  const double per_peer = buffers * params * 4;
  const double need = here * per_peer;
  std::string limit_is;
  const double limit = memory_limit_bytes(&limit_is);
  if (limit <= 0 || need <= limit) return "";
  std::string parts = "parameters, gradient";
  if (optimizer_state > 0) parts += optimizer_state == 2 ? ", AdamW's two moments" : ", the momentum";
  if (algorithm_buffers > 0) parts += ", " + std::to_string(static_cast<int>(algorithm_buffers)) + " of " + algorithm->name + "'s own";
  if (cluster) parts += ", one model arriving";
  if (checkpoint > 0) parts += ", the checkpoints' snapshot of the parameters" + std::string(optimizer_state > 0 ? " and the optimizer's state" : "");
  const std::string who = here > 1 ? std::to_string(here) + " peers on this machine (at loopback addresses) need"
                                   : "a peer of this model needs";
  return who + " at least " + bytes_text(need) + " (" + std::to_string(static_cast<int64_t>(params)) + " parameters x " +
         std::to_string(static_cast<int>(buffers)) + " model-sized buffers: " + parts + (here > 1 ? ", each" : "") +
         "; activations and data come on top), more than the " + bytes_text(limit) + " of " + limit_is +
         "; choose a smaller model" + (here > 1 ? ", fewer peers here, or spread them over machines" : " or a larger machine");
}

}  // namespace hearsay
