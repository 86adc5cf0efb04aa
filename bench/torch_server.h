// PyTorch's side of a step comparison (bench/torch_step.py, bench/torch_gpt.py with
// --serve), driven over pipes so that its rounds interleave with hearsay's under the same
// machine noise.
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "subprocess.h"

namespace hearsay::bench {

// Starts `script args...` under /usr/bin/python3 (or $HEARSAY_TORCH_PYTHON: a machine whose
// CUDA build of torch lives elsewhere) on one thread (OMP_NUM_THREADS=1). The
// script announces {"ready":true,"blas":...}, then answers each line "N" with the
// seconds N steps took. Null, with *why, when python3 or torch could not start.
inline std::unique_ptr<LineProcess> start_torch_server(const std::string& script, const std::vector<std::string>& args,
                                                       std::string* blas, std::string* why) {
  const char* python = std::getenv("HEARSAY_TORCH_PYTHON");
  std::vector<std::string> argv{python != nullptr && *python != '\0' ? python : "/usr/bin/python3",
                                std::string(HEARSAY_SOURCE_DIR) + "/bench/" + script, "--serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = std::make_unique<LineProcess>(argv, std::vector<std::string>{"OMP_NUM_THREADS=1"});
  std::string line;
  if (!p->receive(&line) || line.find("\"ready\":true") == std::string::npos) {
    *why = line.empty() ? "python3 or torch could not start (make bench-deps installs python3-torch)" : line;
    return nullptr;
  }
  const auto b = line.find("\"blas\":\"");
  if (b != std::string::npos) *blas = line.substr(b + 8, line.find('"', b + 8) - b - 8);
  return p;
}

// A body for time_interleaved(): N of the server's steps, in seconds. Once the server
// stops answering, *failed is set and the body returns 1 s without asking again.
inline std::function<double(int)> torch_steps(LineProcess& torch, bool* failed) {
  return [&torch, failed](int iters) {
    std::string line;
    if (*failed || !torch.send(std::to_string(iters)) || !torch.receive(&line)) {
      *failed = true;
      return 1.0;
    }
    return std::atof(line.c_str());
  };
}

}  // namespace hearsay::bench
