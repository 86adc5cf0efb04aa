// The compute backend: where a peer's flat parameter and gradient buffers live and the
// kernels a training step needs. Implementations: "cpu" (OpenBLAS and vectorised loops)
// and "cuda:N" (cuBLAS and kernels of our own). Models, optimizers and codecs call only
// this interface; they never know which device they run on.
//
// Pointers passed to a backend are its own device pointers (from allocate()), except
// where a parameter says "host". All matrices are row-major.
//
// Thread safety: a backend instance belongs to one peer and is used from one thread.
// Operations may run asynchronously on the device; download() and synchronize() wait.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hearsay {

enum class Activation : uint8_t { kNone, kRelu };

// sgd_update's rule: SGD with momentum (heavy-ball or Nesterov) and L2 weight decay folded
// into the gradient.
struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  // The gradient is read as g x grad_scale (global-norm clipping without a scaled copy of
  // the gradient: optim/grad_clip.cpp); 1 reads it as it is, bit for bit.
  float grad_scale = 1.0f;
};

// adamw_update's rule: Adam with decoupled weight decay (Loshchilov & Hutter 2019), the
// inner optimizer of DiLoCo.
struct AdamWParams {
  float lr = 0.001f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;  // the moments' decay rates
  float beta2 = 0.999f;
  float eps = 1e-8f;  // added to the denominator sqrt(v)
  float grad_scale = 1.0f;  // as SgdParams::grad_scale
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Bytes of this backend's memory that DeviceBuffers hold now (every buffer a backend
  // hands out goes through one): the model, gradient, optimizer state, activations and
  // the engine's scratch, on the device a peer's memory event names.
  uint64_t buffer_bytes() const { return buffer_bytes_.load(std::memory_order_relaxed); }

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  // True when device pointers are ordinary host memory.
  virtual bool is_host() const = 0;

  // --- Memory --------------------------------------------------------------------------
  // Zero-filled device memory, 64-byte aligned; throws BackendError when out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // --- Dense algebra -------------------------------------------------------------------
  // C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, row-major.
  virtual void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) = 0;
  // y += alpha * x
  virtual void axpy(size_t n, float alpha, const float* x, float* y) = 0;
  // x *= alpha
  virtual void scale(size_t n, float alpha, float* x) = 0;

  // --- Fused layer kernels --------------------------------------------------------------
  // y[r,c] = act(y[r,c] + bias[c]) in one pass (bias may be null).
  virtual void bias_activation(float* y, const float* bias, int rows, int cols,
                               Activation act) = 0;
  // dy[r,c] *= act'(y[r,c]) and, if dbias is not null, dbias[c] = sum_r dy[r,c]; one pass.
  virtual void activation_backward_bias_grad(float* dy, const float* y, float* dbias, int rows,
                                             int cols, Activation act) = 0;
  // Softmax cross-entropy, forward and backward fused. For each row: dlogits = (softmax -
  // onehot(label)) * grad_scale. stats (device, 2 floats) receives {sum of losses, number
  // of rows whose argmax equals the label}. Labels must lie in [0, cols).
  virtual void softmax_cross_entropy(const float* logits, const int32_t* labels, int rows,
                                     int cols, float grad_scale, float* dlogits,
                                     float* stats) = 0;

  // --- Convolution helpers (NHWC activations) -------------------------------------------
  // cols[(b,oy,ox), (ky,kx,c)] from x[b,y,x,c]; stride 1, zero padding `pad`.
  virtual void im2col(const float* x, int batch, int h, int w, int c, int k, int pad,
                      float* cols) = 0;
  // dx[b,y,x,c] = sum of the cols entries that im2col read from it (overwrites dx).
  virtual void col2im(const float* cols, int batch, int h, int w, int c, int k, int pad,
                      float* dx) = 0;
  // 2x2 max pooling, stride 2 (h and w even). argmax records which of the 4 won.
  virtual void maxpool2_forward(const float* x, int batch, int h, int w, int c, float* y,
                                int32_t* argmax) = 0;
  virtual void maxpool2_backward(const float* dy, const int32_t* argmax, int batch, int h, int w,
                                 int c, float* dx) = 0;

  // --- Transformer kernels ---------------------------------------------------------------
  // Activations are [rows, c] with rows = batch x context tokens, in token order within
  // each sequence. Each kernel is one pass (or, for attention, one head at a time).
  //
  // y[r] = wte[tokens[r]] + wpe[r % context] (rows of c floats). Tokens lie in [0, vocab).
  virtual void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int rows,
                                 int context, int c, int vocab, float* y) = 0;
  // dwte[tokens[r]] += dy[r] and dwpe[r % context] += dy[r]: both accumulate.
  virtual void embedding_backward(const float* dy, const int32_t* tokens, int rows, int context, int c,
                                  float* dwte, float* dwpe) = 0;
  // LayerNorm of each row (biased variance, eps 1e-5): y = (x - mean) * rstd * gamma + beta;
  // mean and rstd ([rows] each) are kept for the backward pass.
  virtual void layernorm_forward(const float* x, const float* gamma, const float* beta, int rows, int c,
                                 float* y, float* mean, float* rstd) = 0;
  // dx += the gradient through the normalisation (it accumulates into a residual stream's
  // gradient); dgamma and dbeta are overwritten.
  virtual void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                  const float* rstd, int rows, int c, float* dx, float* dgamma,
                                  float* dbeta) = 0;
  // pre += bias (in place, per column), then out = gelu(pre) with GELU's tanh form (GPT-2's).
  virtual void bias_gelu_forward(float* pre, const float* bias, float* out, int rows, int cols) = 0;
  // dpre = dout * gelu'(pre) (dpre may be dout) and dbias[c] = sum_r dpre[r, c].
  virtual void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias,
                                       int rows, int cols) = 0;
  // Causal multi-head self-attention. qkv is [rows, 3c]: each token's query, key and value,
  // each c = heads x (c / heads) wide, head h in columns [h*d, (h+1)*d). out [rows, c]
  // receives softmax(q k^T / sqrt(d), masked to keys at or before the query) v per head;
  // lse [batch, heads, context] the log-sum-exp of each query's scaled scores, all the
  // backward pass keeps (it recomputes the probabilities, so no batch of score matrices
  // is ever stored).
  virtual void attention_forward(const float* qkv, int batch, int context, int c, int heads, float* out,
                                 float* lse) = 0;
  // dqkv [rows, 3c] (overwritten) from dout [rows, c], the forward pass's qkv, out and lse.
  virtual void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse,
                                  int batch, int context, int c, int heads, float* dqkv) = 0;
  // Sum of squares of n floats, on the host (global-norm gradient clipping).
  virtual double sum_squares(const float* x, size_t n) = 0;

  // --- Optimizer ------------------------------------------------------------------------
  // One SGD step over flat buffers: g' = g + wd*w; v = m*v + g'; w -= lr * (nesterov ?
  // g' + m*v : v). velocity may be null when momentum is 0.
  virtual void sgd_update(float* w, const float* g, float* velocity, size_t n,
                          const SgdParams& p) = 0;
  // One AdamW step over flat buffers, `t` the 1-based number of this step (t >= 1):
  //   w -= lr*wd*w                           (decoupled: the decay never enters m or v)
  //   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
  //   w -= lr * (m / c1) / (sqrt(v / c2) + eps),  c1 = 1 - b1^t, c2 = 1 - b2^t
  // c1 and c2 are computed in double on the host and passed to the kernel as fp32, so
  // every backend uses the same values. m and v (n floats each) are both required.
  virtual void adamw_update(float* w, const float* g, float* m, float* v, size_t n,
                            const AdamWParams& p, int64_t t) = 0;

 private:
  friend class DeviceBuffer;
  std::atomic<uint64_t> buffer_bytes_{0};
};

// n floats of `backend`'s memory at `src` as a host vector (empty when src is null):
// copied straight where the backend is the host (no zeroed vector written over),
// downloaded otherwise.
std::vector<float> download_floats(Backend& backend, const float* src, size_t n);
// The same into `out`, whose memory is reused when it holds n floats already (a
// checkpoint's snapshot: a copy into pages already resident, not freshly faulted ones).
void download_floats_into(Backend& backend, const float* src, size_t n, std::vector<float>& out);

// Sum of squares of n floats in host memory, in double: the CPU backend's sum_squares,
// and what the engine measures received updates and its own gradient with.
double host_sum_squares(const float* x, size_t n);

// Creates the backend a device string names: "cpu" or "cuda:N". `threads` is the CPU
// backend's BLAS thread count. Throws InputError for an unknown or unavailable device.
std::unique_ptr<Backend> create_backend(const std::string& device, int threads = 1);

// Device strings this build can create (cuda entries only where a GPU is present).
std::vector<std::string> available_devices();

// Owns device memory of one backend; moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace hearsay
