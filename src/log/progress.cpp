#include <unistd.h>

#include <cstdio>

#include "hearsay/log.h"

namespace hearsay {

Progress::Progress(std::FILE* out, const std::string& label, double plain_every_s)
    : out_(out), label_(label), tty_(::isatty(::fileno(out)) != 0), plain_every_s_(plain_every_s),
      last_(std::chrono::steady_clock::now()) {}

std::string Progress::render(const ProgressState& s) const {
  char acc[32] = "-";
  if (s.test_acc >= 0) std::snprintf(acc, sizeof(acc), "%.2f%%", 100.0 * s.test_acc);
  char eta[32] = "-";
  if (s.eta_s >= 0) {
    const int sec = static_cast<int>(s.eta_s + 0.5);
    std::snprintf(eta, sizeof(eta), "%d:%02d", sec / 60, sec % 60);
  }
  char line[256];
  std::snprintf(line, sizeof(line), "%s step %lld  epoch %.2f  loss %.4f  test_acc %s  %.0f samples/s  eta %s",
                label_.c_str(), static_cast<long long>(s.step), s.epoch, s.loss, acc, s.samples_per_s, eta);
  return line;
}

void Progress::update(const ProgressState& s, bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  const std::string line = render(s);
  if (tty_) {
    if (!force && since < 0.1) return;
    std::fprintf(out_, "\r\033[K%s", line.c_str());
  } else {
    if (!force && since < plain_every_s_) return;
    // A line says what changed: the same one again (an evaluation's, then the end's) is noise.
    if (line == last_line_) return;
    std::fprintf(out_, "%s\n", line.c_str());
  }
  last_line_ = line;
  std::fflush(out_);
  last_ = now;
  printed_ = true;
}

void Progress::finish(const ProgressState& s) {
  update(s, true);
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace hearsay
