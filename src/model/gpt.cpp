#include "gpt.h"

#include <cmath>
#include <sstream>

#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay {

// Offsets of one block's tensors in the flat buffers.
struct Gpt::BlockParams {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
};

// One block's activations for up to max_batch sequences (n = rows x context tokens).
struct Gpt::BlockActs {
  DeviceBuffer ln1, ln1_mean, ln1_rstd;  // ln_1(x)            [n, c]
  DeviceBuffer qkv;                      // c_attn              [n, 3c]
  DeviceBuffer att, lse;                 // attention output    [n, c]; [rows, heads, context]
  DeviceBuffer res_mid;                  // x + attn            [n, c]
  DeviceBuffer ln2, ln2_mean, ln2_rstd;  // ln_2(res_mid)       [n, c]
  DeviceBuffer fc_pre, fc_act;           // c_fc, gelu          [n, 4c]
  DeviceBuffer res_out;                  // res_mid + mlp       [n, c]
};

void check_gpt_spec(const GptSpec& s) {
  auto fail = [](const std::string& m) { throw InputError("impossible model shape: model.gpt." + m); };
  if (s.vocab != 256) fail("vocab must be 256 (bytes), got " + std::to_string(s.vocab));
  if (s.context < 1 || s.context > 4096) fail("context must be in [1, 4096], got " + std::to_string(s.context));
  if (s.layers < 1 || s.layers > 64) fail("layers must be in [1, 64], got " + std::to_string(s.layers));
  if (s.width < 1 || s.width > 8192) fail("width must be in [1, 8192], got " + std::to_string(s.width));
  if (s.heads < 1 || s.width % s.heads != 0) {
    fail("heads (" + std::to_string(s.heads) + ") must divide width (" + std::to_string(s.width) + ")");
  }
}

Gpt::Gpt(const GptSpec& spec, Backend& backend, int max_batch, uint64_t seed)
    : spec_(spec), backend_(backend), max_batch_(max_batch) {
  check_gpt_spec(spec);
  if (max_batch < 1) throw InputError("model: batch size must be >= 1, got " + std::to_string(max_batch));
  const int c = spec.width, t = spec.context, v = spec.vocab;
  auto add = [&](const std::string& name, std::vector<int> shape) {
    ParamView view{name, num_params_, 1, std::move(shape)};
    for (int d : view.shape) view.size *= static_cast<size_t>(d);
    num_params_ += view.size;
    views_.push_back(view);
    return view.offset;
  };
  wte_ = add("wte", {v, c});
  wpe_ = add("wpe", {t, c});
  for (int l = 0; l < spec.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    BlockParams p{};
    p.ln1_w = add(h + "ln_1.weight", {c});
    p.ln1_b = add(h + "ln_1.bias", {c});
    p.qkv_w = add(h + "attn.c_attn.weight", {3 * c, c});
    p.qkv_b = add(h + "attn.c_attn.bias", {3 * c});
    p.proj_w = add(h + "attn.c_proj.weight", {c, c});
    p.proj_b = add(h + "attn.c_proj.bias", {c});
    p.ln2_w = add(h + "ln_2.weight", {c});
    p.ln2_b = add(h + "ln_2.bias", {c});
    p.fc_w = add(h + "mlp.c_fc.weight", {4 * c, c});
    p.fc_b = add(h + "mlp.c_fc.bias", {4 * c});
    p.fc2_w = add(h + "mlp.c_proj.weight", {c, 4 * c});
    p.fc2_b = add(h + "mlp.c_proj.bias", {c});
    block_params_.push_back(p);
  }
  lnf_w_ = add("ln_f.weight", {c});
  lnf_b_ = add("ln_f.bias", {c});

  params_ = DeviceBuffer(backend_, sizeof(float) * num_params_);
  grads_ = DeviceBuffer(backend_, sizeof(float) * num_params_);
  const size_t n = static_cast<size_t>(max_batch) * t;
  auto floats = [&](size_t count) { return DeviceBuffer(backend_, sizeof(float) * count); };
  emb_ = floats(n * c);
  for (int l = 0; l < spec.layers; ++l) {
    BlockActs a;
    a.ln1 = floats(n * c), a.ln1_mean = floats(n), a.ln1_rstd = floats(n);
    a.qkv = floats(n * 3 * c);
    a.att = floats(n * c), a.lse = floats(n * spec.heads);
    a.res_mid = floats(n * c);
    a.ln2 = floats(n * c), a.ln2_mean = floats(n), a.ln2_rstd = floats(n);
    a.fc_pre = floats(n * 4 * c), a.fc_act = floats(n * 4 * c);
    a.res_out = floats(n * c);
    acts_.push_back(std::move(a));
  }
  lnf_ = floats(n * c), lnf_mean_ = floats(n), lnf_rstd_ = floats(n);
  logits_ = floats(n * v), dlogits_ = floats(n * v), stats_ = floats(2);
  dres_ = floats(n * c), dln_ = floats(n * c), datt_ = floats(n * c), dqkv_ = floats(n * 3 * c);
  dfc_ = floats(n * 4 * c);
  sample_tokens_ = DeviceBuffer(backend_, sizeof(int32_t) * t);

  // GPT-2's initialisation: N(0, 0.02) for weights and embeddings, the residual
  // projections scaled by 1/sqrt(2 x layers), zero biases, unit LayerNorm gains.
  // Written in place on a host backend (its fresh buffer is zeros): a staging copy of a
  // 1B-parameter model would be 4 GB more and a pass more.
  std::vector<float> staging(backend_.is_host() ? 0 : num_params_, 0.0f);
  float* const host = backend_.is_host() ? params_.f32() : staging.data();
  Rng rng(seed, 2000);
  const float proj_std = 0.02f / std::sqrt(2.0f * spec.layers);
  for (const ParamView& view : views_) {
    float* p = host + view.offset;
    const bool is_ln_gain = view.name.find("ln_") != std::string::npos && view.name.ends_with(".weight");
    if (is_ln_gain) {
      for (size_t i = 0; i < view.size; ++i) p[i] = 1.0f;
    } else if (view.shape.size() == 2) {
      const float std = view.name.ends_with("c_proj.weight") ? proj_std : 0.02f;
      rng.normals(p, view.size, std);
    }
  }
  if (!backend_.is_host()) set_params(staging);
}

Gpt::~Gpt() = default;

void Gpt::forward(const int32_t* tokens, int rows) {
  HEARSAY_CHECK(rows >= 1 && rows <= max_batch_, "gpt: batch of " + std::to_string(rows) + " sequences outside [1, " +
                                                     std::to_string(max_batch_) + "]");
  Backend& b = backend_;
  const int c = spec_.width, t = spec_.context, n = rows * t;
  const float* w = params();
  b.embedding_forward(tokens, w + wte_, w + wpe_, n, t, c, spec_.vocab, emb_.f32());
  const float* x = emb_.f32();
  for (int l = 0; l < spec_.layers; ++l) {
    const BlockParams& p = block_params_[l];
    BlockActs& a = acts_[l];
    b.layernorm_forward(x, w + p.ln1_w, w + p.ln1_b, n, c, a.ln1.f32(), a.ln1_mean.f32(), a.ln1_rstd.f32());
    b.gemm(false, true, n, 3 * c, c, 1.0f, a.ln1.f32(), c, w + p.qkv_w, c, 0.0f, a.qkv.f32(), 3 * c);
    b.bias_activation(a.qkv.f32(), w + p.qkv_b, n, 3 * c, Activation::kNone);
    b.attention_forward(a.qkv.f32(), rows, t, c, spec_.heads, a.att.f32(), a.lse.f32());
    // The residual add rides on the projection's GEMM (beta = 1 over a copy of x).
    b.copy(a.res_mid.data(), x, sizeof(float) * n * c);
    b.gemm(false, true, n, c, c, 1.0f, a.att.f32(), c, w + p.proj_w, c, 1.0f, a.res_mid.f32(), c);
    b.bias_activation(a.res_mid.f32(), w + p.proj_b, n, c, Activation::kNone);
    b.layernorm_forward(a.res_mid.f32(), w + p.ln2_w, w + p.ln2_b, n, c, a.ln2.f32(), a.ln2_mean.f32(),
                        a.ln2_rstd.f32());
    b.gemm(false, true, n, 4 * c, c, 1.0f, a.ln2.f32(), c, w + p.fc_w, c, 0.0f, a.fc_pre.f32(), 4 * c);
    b.bias_gelu_forward(a.fc_pre.f32(), w + p.fc_b, a.fc_act.f32(), n, 4 * c);
    b.copy(a.res_out.data(), a.res_mid.data(), sizeof(float) * n * c);
    b.gemm(false, true, n, c, 4 * c, 1.0f, a.fc_act.f32(), 4 * c, w + p.fc2_w, 4 * c, 1.0f, a.res_out.f32(), c);
    b.bias_activation(a.res_out.f32(), w + p.fc2_b, n, c, Activation::kNone);
    x = a.res_out.f32();
  }
  b.layernorm_forward(x, w + lnf_w_, w + lnf_b_, n, c, lnf_.f32(), lnf_mean_.f32(), lnf_rstd_.f32());
  // The head is the token embedding, transposed.
  b.gemm(false, true, n, spec_.vocab, c, 1.0f, lnf_.f32(), c, w + wte_, c, 0.0f, logits_.f32(), spec_.vocab);
}

BatchStats Gpt::loss(const int32_t* targets, int rows, float grad_scale) {
  const int n = rows * spec_.context;
  backend_.softmax_cross_entropy(logits_.f32(), targets, n, spec_.vocab, grad_scale, dlogits_.f32(), stats_.f32());
  float stats[2];
  backend_.download(stats, stats_.data(), sizeof(stats));
  return BatchStats{stats[0], static_cast<int64_t>(stats[1]), n};
}

BatchStats Gpt::evaluate(const Batch& batch) {
  forward(static_cast<const int32_t*>(batch.x), batch.rows);
  return loss(batch.y, batch.rows, 1.0f);
}

BatchStats Gpt::forward_backward(const Batch& batch) {
  const auto* tokens = static_cast<const int32_t*>(batch.x);
  const int rows = batch.rows;
  forward(tokens, rows);
  const int c = spec_.width, t = spec_.context, v = spec_.vocab, n = rows * t;
  const BatchStats stats = loss(batch.y, rows, 1.0f / static_cast<float>(n));
  Backend& b = backend_;
  const float* w = params();
  float* g = grads();
  float* dres = dres_.f32();
  float* dln = dln_.f32();
  // Head: dwte from the logits (overwrites; the embedding adds its own part below).
  b.gemm(true, false, v, c, n, 1.0f, dlogits_.f32(), v, lnf_.f32(), c, 0.0f, g + wte_, c);
  b.gemm(false, false, n, c, v, 1.0f, dlogits_.f32(), v, w + wte_, c, 0.0f, dln, c);
  b.fill_zero(dres, sizeof(float) * n * c);
  b.layernorm_backward(dln, acts_.back().res_out.f32(), w + lnf_w_, lnf_mean_.f32(), lnf_rstd_.f32(), n, c, dres, g + lnf_w_, g + lnf_b_);
  for (int l = spec_.layers - 1; l >= 0; --l) {
    const BlockParams& p = block_params_[l];
    BlockActs& a = acts_[l];
    const float* x = l == 0 ? emb_.f32() : acts_[l - 1].res_out.f32();
    // MLP: dres is d(res_out); the residual passes it to res_mid unchanged.
    b.activation_backward_bias_grad(dres, a.res_out.f32(), g + p.fc2_b, n, c, Activation::kNone);
    b.gemm(true, false, c, 4 * c, n, 1.0f, dres, c, a.fc_act.f32(), 4 * c, 0.0f, g + p.fc2_w, 4 * c);
    b.gemm(false, false, n, 4 * c, c, 1.0f, dres, c, w + p.fc2_w, 4 * c, 0.0f, dfc_.f32(), 4 * c);
    b.gelu_backward_bias_grad(dfc_.f32(), a.fc_pre.f32(), dfc_.f32(), g + p.fc_b, n, 4 * c);
    b.gemm(true, false, 4 * c, c, n, 1.0f, dfc_.f32(), 4 * c, a.ln2.f32(), c, 0.0f, g + p.fc_w, c);
    b.gemm(false, false, n, c, 4 * c, 1.0f, dfc_.f32(), 4 * c, w + p.fc_w, c, 0.0f, dln, c);
    b.layernorm_backward(dln, a.res_mid.f32(), w + p.ln2_w, a.ln2_mean.f32(), a.ln2_rstd.f32(), n, c, dres,
                         g + p.ln2_w, g + p.ln2_b);
    // Attention: dres is now d(res_mid).
    b.activation_backward_bias_grad(dres, a.res_mid.f32(), g + p.proj_b, n, c, Activation::kNone);
    b.gemm(true, false, c, c, n, 1.0f, dres, c, a.att.f32(), c, 0.0f, g + p.proj_w, c);
    b.gemm(false, false, n, c, c, 1.0f, dres, c, w + p.proj_w, c, 0.0f, datt_.f32(), c);
    b.attention_backward(datt_.f32(), a.qkv.f32(), a.att.f32(), a.lse.f32(), rows, t, c, spec_.heads, dqkv_.f32());
    b.activation_backward_bias_grad(dqkv_.f32(), a.qkv.f32(), g + p.qkv_b, n, 3 * c, Activation::kNone);
    b.gemm(true, false, 3 * c, c, n, 1.0f, dqkv_.f32(), 3 * c, a.ln1.f32(), c, 0.0f, g + p.qkv_w, c);
    b.gemm(false, false, n, c, 3 * c, 1.0f, dqkv_.f32(), 3 * c, w + p.qkv_w, c, 0.0f, dln, c);
    b.layernorm_backward(dln, x, w + p.ln1_w, a.ln1_mean.f32(), a.ln1_rstd.f32(), n, c, dres, g + p.ln1_w,
                         g + p.ln1_b);
  }
  b.fill_zero(g + wpe_, sizeof(float) * t * c);
  b.embedding_backward(dres, tokens, n, t, c, g + wte_, g + wpe_);
  return stats;
}

std::vector<float> Gpt::next_token_logits(const std::vector<int32_t>& tokens) {
  const int t = spec_.context;
  if (tokens.empty() || static_cast<int>(tokens.size()) > t) {
    throw InputError("gpt: a prompt of " + std::to_string(tokens.size()) + " tokens; the model reads 1 to " +
                     std::to_string(t));
  }
  // Positions after the prompt are padding: attention is causal, so they cannot change
  // the logits at the prompt's last position.
  std::vector<int32_t> padded(tokens);
  padded.resize(t, 0);
  backend_.upload(sample_tokens_.data(), padded.data(), sizeof(int32_t) * t);
  forward(sample_tokens_.i32(), 1);
  std::vector<float> out(spec_.vocab);
  backend_.download(out.data(), logits_.f32() + (tokens.size() - 1) * spec_.vocab, sizeof(float) * out.size());
  return out;
}

std::string Gpt::summary() const {
  std::ostringstream out;
  out << "gpt: " << spec_.layers << " layers, " << spec_.heads << " heads, width " << spec_.width << ", context "
      << spec_.context << ", vocab " << spec_.vocab << " (bytes), head tied to wte\n";
  out << "total " << num_params_ << " params";
  return out.str();
}

double Gpt::gemm_flops_per_sample() const {
  const double c = spec_.width, t = spec_.context, v = spec_.vocab;
  // Per token: the block's linear layers (3c + c + 4c + 4c outputs of c inputs) and the
  // head, forward and twice backward. Attention's products over the causal triangle of
  // the scores (t (t + 1) / 2 query-key pairs a head): 2 forward, 5 backward (the scores
  // again, dV, dP, dQ, dK). The CPU kernels compute a little more (whole blocks of 64
  // queries), the CUDA ones the full t x t.
  const double linear = 2.0 * (12.0 * c * c) * spec_.layers + 2.0 * c * v;
  const double attention_per_sequence = 2.0 * (t * (t + 1) / 2.0) * c * (2 + 5) * spec_.layers;
  return t * 3.0 * linear + attention_per_sequence;
}

}  // namespace hearsay
