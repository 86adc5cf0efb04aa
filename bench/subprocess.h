// A child process spoken to line by line over pipes: the step bench drives PyTorch this
// way so that its rounds interleave with ours under the same machine noise.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace hearsay::bench {

class LineProcess {
 public:
  // Runs argv[0] (a path) with argv; extra_env entries are "NAME=value".
  LineProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      for (const auto& e : extra_env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  ~LineProcess() {
    if (in_ != nullptr) std::fclose(in_);
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) {
      int status;
      waitpid(pid_, &status, 0);
    }
  }
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  bool ok() const { return pid_ > 0 && in_ != nullptr && out_ != nullptr; }
  bool send(const std::string& line) {
    return ok() && std::fprintf(in_, "%s\n", line.c_str()) > 0 && std::fflush(in_) == 0;
  }
  // Next line from the child without the newline; false at end of output.
  bool receive(std::string* line) {
    if (!ok()) return false;
    line->clear();
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), out_) != nullptr) {
      *line += buf;
      if (!line->empty() && line->back() == '\n') {
        line->pop_back();
        return true;
      }
    }
    return !line->empty();
  }

 private:
  pid_t pid_ = -1;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
};

}  // namespace hearsay::bench
