#include "common.cuh"
#include "kernels.cuh"

namespace hearsay::cuda {
namespace {

// One thread per element of cols[(b,oy,ox), (ky,kx,c)]; consecutive threads read
// consecutive channels of one input pixel.
__global__ void im2col_kernel(const float* __restrict__ x, int batch, int h, int w, int c, int k, int pad, float* __restrict__ cols) {
  const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
  const size_t n = size_t(batch) * oh * ow * k * k * c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    size_t t = i;
    const int ch = t % c; t /= c;
    const int kx = t % k; t /= k;
    const int ky = t % k; t /= k;
    const int ox = t % ow; t /= ow;
    const int oy = t % oh; t /= oh;
    const int b = int(t);
    const int iy = oy + ky - pad, ix = ox + kx - pad;
    cols[i] = (iy < 0 || iy >= h || ix < 0 || ix >= w) ? 0.0f : x[((size_t(b) * h + iy) * w + ix) * c + ch];
  }
}

// One thread per input element: it gathers every cols entry that read it, so no atomics.
__global__ void col2im_kernel(const float* __restrict__ cols, int batch, int h, int w, int c, int k, int pad, float* __restrict__ dx) {
  const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
  const size_t n = size_t(batch) * h * w * c;
  const size_t row_len = size_t(k) * k * c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    size_t t = i;
    const int ch = t % c; t /= c;
    const int ix = t % w; t /= w;
    const int iy = t % h; t /= h;
    const int b = int(t);
    float sum = 0.0f;
    for (int ky = 0; ky < k; ++ky) {
      const int oy = iy - ky + pad;
      if (oy < 0 || oy >= oh) continue;
      for (int kx = 0; kx < k; ++kx) {
        const int ox = ix - kx + pad;
        if (ox < 0 || ox >= ow) continue;
        sum += cols[((size_t(b) * oh + oy) * ow + ox) * row_len + (size_t(ky) * k + kx) * c + ch];
      }
    }
    dx[i] = sum;
  }
}

__global__ void maxpool2_forward_kernel(const float* __restrict__ x, int batch, int h, int w, int c, float* __restrict__ y, int32_t* __restrict__ argmax) {
  const int oh = h / 2, ow = w / 2;
  const size_t n = size_t(batch) * oh * ow * c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    size_t t = i;
    const int ch = t % c; t /= c;
    const int ox = t % ow; t /= ow;
    const int oy = t % oh; t /= oh;
    const int b = int(t);
    int best = 0;
    float v = -INFINITY;
    for (int q = 0; q < 4; ++q) {
      const float xv = x[((size_t(b) * h + 2 * oy + q / 2) * w + 2 * ox + q % 2) * c + ch];
      if (q == 0 || xv > v) { v = xv; best = q; }
    }
    y[i] = v;
    argmax[i] = best;
  }
}

__global__ void maxpool2_backward_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax, int batch, int h, int w, int c, float* __restrict__ dx) {
  const size_t n = size_t(batch) * h * w * c;
  const int oh = h / 2, ow = w / 2;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    size_t t = i;
    const int ch = t % c; t /= c;
    const int ix = t % w; t /= w;
    const int iy = t % h; t /= h;
    const int b = int(t);
    const size_t o = ((size_t(b) * oh + iy / 2) * ow + ix / 2) * c + ch;
    const int q = (iy % 2) * 2 + ix % 2;
    dx[i] = argmax[o] == q ? dy[o] : 0.0f;
  }
}

}  // namespace

void launch_im2col(cudaStream_t s, const float* x, int batch, int h, int w, int c, int k, int pad, float* cols) {
  const size_t n = size_t(batch) * (h + 2 * pad - k + 1) * (w + 2 * pad - k + 1) * k * k * c;
  im2col_kernel<<<grid_for(n), 256, 0, s>>>(x, batch, h, w, c, k, pad, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_col2im(cudaStream_t s, const float* cols, int batch, int h, int w, int c, int k, int pad, float* dx) {
  const size_t n = size_t(batch) * h * w * c;
  col2im_kernel<<<grid_for(n), 256, 0, s>>>(cols, batch, h, w, c, k, pad, dx);
  CUDA_CHECK(cudaGetLastError());
}

void launch_maxpool2_forward(cudaStream_t s, const float* x, int batch, int h, int w, int c, float* y, int32_t* argmax) {
  const size_t n = size_t(batch) * (h / 2) * (w / 2) * c;
  maxpool2_forward_kernel<<<grid_for(n), 256, 0, s>>>(x, batch, h, w, c, y, argmax);
  CUDA_CHECK(cudaGetLastError());
}

void launch_maxpool2_backward(cudaStream_t s, const float* dy, const int32_t* argmax, int batch, int h, int w, int c, float* dx) {
  const size_t n = size_t(batch) * h * w * c;
  maxpool2_backward_kernel<<<grid_for(n), 256, 0, s>>>(dy, argmax, batch, h, w, c, dx);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::cuda
