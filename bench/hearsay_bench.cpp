// hearsay-bench SUITE: benchmark programs that print JSON Lines (docs/BENCHMARKS.md).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "hearsay/error.h"

namespace hearsay::bench {
int run_step_bench(int argc, char** argv);
int run_transport_bench(int argc, char** argv);
int run_codec_bench(int argc, char** argv);
int run_compression_bench(int argc, char** argv);
int run_transfer_bench(int argc, char** argv);
}

int main(int argc, char** argv) {
  const char* usage =
      "usage: hearsay-bench SUITE [options]\n"
      "suites:\n"
      "  step   local training step of the MLP 784-256-256-10, against sgemm and PyTorch\n"
      "         options: --batches 64,256  --repeats 7  --round-s 0.5  --no-torch\n"
      "  transport  loopback throughput and latency of each transport, beside iperf3 and fi_pingpong\n"
      "         options: --sizes 4096,65536,1048576,16777216  --transports tcp,fabric:shm  --seconds 1\n"
      "                  --rounds 3  --no-tools\n"
      "  codec  encode and decode-accumulate GB/s and compression ratio of every codec, beside memcpy\n"
      "         options: --sizes 1048576,26214400  --codecs none,fp16,...  --repeats 5  --round-s 0.25\n"
      "  compression  4 peers train the Fashion-MNIST MLP with each codec: bytes sent to reach the\n"
      "         target accuracy, against uncompressed allreduce\n"
      "         options: --codecs none,topk,...  --algorithm gossip_grad  --target 0.85  --repeats 1\n"
      "  transfer  one model message of a gigabyte between two engines over an emulated WAN link,\n"
      "         whole and with its connection cut half way: arrival, bytes sent, heartbeats\n"
      "         options: --mib 1024  --mbps 100  --latency-ms 20  --window-mib 64\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string suite = argv[1];
  try {
    if (suite == "step") return hearsay::bench::run_step_bench(argc - 2, argv + 2);
    if (suite == "transport") return hearsay::bench::run_transport_bench(argc - 2, argv + 2);
    if (suite == "codec") return hearsay::bench::run_codec_bench(argc - 2, argv + 2);
    if (suite == "compression") return hearsay::bench::run_compression_bench(argc - 2, argv + 2);
    if (suite == "transfer") return hearsay::bench::run_transfer_bench(argc - 2, argv + 2);
  } catch (const hearsay::InputError& e) {
    std::fprintf(stderr, "hearsay-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hearsay-bench: failed: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "hearsay-bench: unknown suite '%s'\n%s", suite.c_str(), usage);
  return 2;
}
