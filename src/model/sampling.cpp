// Text from a trained GPT: the prompt's bytes, then one byte at a time drawn from the
// model's next-byte distribution at a temperature (0: always the likeliest byte), each
// step reading at most the model's context of the bytes before it.
#include <algorithm>
#include <cmath>

#include "gpt.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/rng.h"

namespace hearsay {

std::string generate_text(Trainable& model, const std::string& prompt, int tokens, double temperature,
                          uint64_t seed) {
  auto* gpt = dynamic_cast<Gpt*>(&model);
  if (gpt == nullptr) throw InputError("sampling needs a GPT model (model.kind GPT)");
  if (prompt.empty()) throw InputError("sampling: the prompt is empty");
  if (tokens < 0) throw InputError("sampling: the number of tokens must be >= 0");
  if (!(temperature >= 0.0) || !std::isfinite(temperature)) {
    throw InputError("sampling: the temperature must be >= 0, got " + std::to_string(temperature));
  }
  const size_t context = static_cast<size_t>(gpt->spec().context);
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  for (auto& t : seq) t = static_cast<uint8_t>(t);
  Rng rng(seed, 3000);
  std::string out = prompt;
  for (int i = 0; i < tokens; ++i) {
    const size_t from = seq.size() > context ? seq.size() - context : 0;
    const std::vector<float> logits = gpt->next_token_logits(std::vector<int32_t>(seq.begin() + static_cast<int64_t>(from), seq.end()));
    int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (temperature > 0.0) {
      // Softmax of logits / temperature, drawn by inverse CDF.
      std::vector<double> p(logits.size());
      double total = 0.0;
      for (size_t k = 0; k < p.size(); ++k) total += p[k] = std::exp((logits[k] - logits[next]) / temperature);
      double u = rng.uniform() * total;
      for (size_t k = 0; k < p.size(); ++k) {
        u -= p[k];
        if (u <= 0.0) {
          next = static_cast<int>(k);
          break;
        }
      }
    }
    seq.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace hearsay
