// hearsay-peer as a user runs it: exit status 2 and a message naming the place for bad
// input, never a crash.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>

#include "test_util.h"

namespace {

struct Run {
  int status;
  std::string output;
};

Run run_peer(const std::string& args) {
  const std::string cmd = std::string(HEARSAY_BIN_DIR) + "/hearsay-peer " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace

using hearsay::test::TempDir;
using hearsay::test::write_file;

TEST_CASE("cli: a config with an unknown field exits 2 with file:line:column") {
  TempDir dir;
  write_file(dir.file("c.textproto"), "name: \"x\"\nmodle { }\n");
  const Run r = run_peer("--config " + dir.file("c.textproto"));
  CHECK(r.status == 2);
  CHECK(r.output.find("c.textproto:2:") != std::string::npos);
}

TEST_CASE("cli: a missing dataset exits 2 naming the file") {
  TempDir dir;
  write_file(dir.file("c.textproto"), "data { dir: \"" + dir.path() + "/nowhere\" }\n");
  const Run r = run_peer("--config " + dir.file("c.textproto"));
  CHECK(r.status == 2);
  CHECK(r.output.find("missing dataset file " + dir.path() + "/nowhere/train-images-idx3-ubyte.gz") != std::string::npos);
}

TEST_CASE("cli: an impossible model shape exits 2 and says why") {
  TempDir dir;
  write_file(dir.file("c.textproto"), "model { kind: CNN conv_channels: [4, 4, 4] }\n");
  const Run r = run_peer("--config " + dir.file("c.textproto"));
  CHECK(r.status == 2);
  CHECK(r.output.find("impossible model shape") != std::string::npos);
}

TEST_CASE("cli: bad arguments exit 2 with usage; --help exits 0") {
  CHECK(run_peer("--frobnicate").status == 2);
  CHECK(run_peer("").status == 2);
  CHECK(run_peer("--config").status == 2);
  const Run help = run_peer("--help");
  CHECK(help.status == 0);
  CHECK(help.output.find("usage: hearsay-peer") != std::string::npos);
}

TEST_CASE("cli: a short run writes its log and prints the final accuracy") {
  TempDir dir;
  write_file(dir.file("c.textproto"),
             "data { format: SYNTHETIC synthetic_dim: 8 num_classes: 3 }\nmodel { hidden: [8] }\ntrain { max_steps: 20 }\n");
  const Run r = run_peer("--quiet --config " + dir.file("c.textproto") + " --log " + dir.file("out/log.jsonl"));
  CHECK(r.status == 0);
  CHECK(r.output.find("final test accuracy") != std::string::npos);
  CHECK(hearsay::test::read_file(dir.file("out/log.jsonl")).find("\"event\":\"end\"") != std::string::npos);
}
