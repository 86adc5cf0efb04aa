// Convergence on Fashion-MNIST within 5 epochs, one peer on the CPU (label "slow").
#include <doctest/doctest.h>

#include "hearsay/config.pb.h"
#include "hearsay/config.h"
#include "hearsay/peer.h"

using namespace hearsay;

namespace {

double final_accuracy(const std::string& text) {
  const auto cfg = parse_config(text, "convergence");
  EventLog log("", cfg.name());
  Peer peer(peer_spec(cfg), log, nullptr);
  return peer.run().final_test_acc;
}

}  // namespace

TEST_CASE("convergence: logistic regression reaches 80% test accuracy within 5 epochs") {
  const double acc = final_accuracy(R"(
    model { kind: LOGREG }
    optim { lr: 0.1 momentum: 0.9 schedule: COSINE }
    train { batch_size: 128 epochs: 5 }
  )");
  MESSAGE("logistic regression test accuracy " << acc);
  CHECK(acc >= 0.80);
}

TEST_CASE("convergence: the MLP 784-256-256-10 reaches 88% test accuracy within 5 epochs") {
  const double acc = final_accuracy(R"(
    model { kind: MLP hidden: [256, 256] }
    optim { lr: 0.1 momentum: 0.9 nesterov: true schedule: COSINE warmup_steps: 200 }
    train { batch_size: 64 epochs: 5 }
  )");
  MESSAGE("MLP test accuracy " << acc);
  CHECK(acc >= 0.88);
}
