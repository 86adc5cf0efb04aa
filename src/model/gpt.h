// A GPT-style decoder-only transformer over bytes (model kind GPT), in the spirit of
// llm.c: token and position embeddings, pre-LayerNorm blocks of causal multi-head
// self-attention and a GELU MLP with residual connections, a final LayerNorm, and an
// output head tied to the token embedding, trained with cross-entropy over the next byte.
//
// Parameters follow nanoGPT's names and PyTorch's layouts (Linear weights [out, in]), in
// one flat buffer: wte [vocab, c], wpe [context, c], then each block's ln_1, attn.c_attn
// (q, k, v stacked: [3c, c]), attn.c_proj, ln_2, mlp.c_fc ([4c, c]), mlp.c_proj, and ln_f.
// tests/model/gpt_reference.py builds the same model in PyTorch from these names.
//
// Every kernel is a Backend call, so the same code runs on the CPU and on CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/model.h"
#include "hearsay/trainable.h"

namespace hearsay {

class Gpt final : public Trainable {
 public:
  // max_batch: sequences of spec.context tokens. Throws InputError for an impossible shape.
  Gpt(const GptSpec& spec, Backend& backend, int max_batch, uint64_t seed);
  ~Gpt() override;

  const GptSpec& spec() const { return spec_; }
  Backend& backend() const override { return backend_; }
  BatchKind batch_kind() const override { return BatchKind::kTokens; }
  int max_batch() const override { return max_batch_; }
  size_t num_params() const override { return num_params_; }
  const std::vector<ParamView>& param_views() const override { return views_; }
  float* params() const override { return params_.f32(); }
  float* grads() const override { return grads_.f32(); }

  // x: int32 tokens [rows, context] on the device; y: each position's next token. The loss
  // is the mean over all rows x context positions; stats count positions.
  BatchStats forward_backward(const Batch& batch) override;
  BatchStats evaluate(const Batch& batch) override;

  // The next-token logits (vocab floats, host) after tokens[0..length) of one sequence,
  // length in [1, context]: what sampling draws from.
  std::vector<float> next_token_logits(const std::vector<int32_t>& tokens);

  std::string summary() const override;
  // Per sequence of context tokens.
  double gemm_flops_per_sample() const override;

 private:
  struct BlockParams;
  struct BlockActs;
  void forward(const int32_t* tokens, int rows);
  BatchStats loss(const int32_t* targets, int rows, float grad_scale);

  GptSpec spec_;
  Backend& backend_;
  int max_batch_;
  size_t num_params_ = 0;
  std::vector<ParamView> views_;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;  // offsets into the flat buffers
  std::vector<BlockParams> block_params_;
  DeviceBuffer params_, grads_;
  // Activations kept for the backward pass, and the gradient scratch it reuses.
  DeviceBuffer emb_;
  std::vector<BlockActs> acts_;
  DeviceBuffer lnf_, lnf_mean_, lnf_rstd_, logits_, dlogits_, stats_;
  DeviceBuffer dres_, dln_, datt_, dqkv_, dfc_;
  DeviceBuffer sample_tokens_;
};

// Throws InputError naming the field when the transformer's shape is impossible.
void check_gpt_spec(const GptSpec& spec);

}  // namespace hearsay
