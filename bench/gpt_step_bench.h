// The step suite's GPT cases (gpt_step_bench.cpp).
#pragma once

#include <string>

#include "bench_util.h"
#include "hearsay/model.h"

namespace hearsay::bench {

// One case: `batch` sequences of spec.context tokens a step, timed in `repeats` rounds.
void run_gpt_step_case(const std::string& case_name, const GptSpec& spec, int batch, int repeats, double round_s,
                       bool with_torch, const StepDevice& device);

}  // namespace hearsay::bench
