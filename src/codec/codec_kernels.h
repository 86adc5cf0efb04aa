// Launchers for the codecs' CUDA kernels (precision.cu, quantized.cu, sparse.cu). Each
// enqueues on `stream` and checks the launch; pointers are device memory unless named
// host_. The payload layouts they write are the CPU codecs' (docs/WIRE.md, "Codecs").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hearsay::codec::cuda {

// precision.cu
void launch_fp16_encode(cudaStream_t s, const float* x, size_t n, uint16_t* out);
void launch_fp16_decode(cudaStream_t s, const uint16_t* in, size_t n, float scale, float* y);
void launch_bf16_encode(cudaStream_t s, const float* x, size_t n, uint16_t* out);
void launch_bf16_decode(cudaStream_t s, const uint16_t* in, size_t n, float scale, float* y);
void launch_fp32_decode(cudaStream_t s, const float* in, size_t n, float scale, float* y);
// scales: one per block of `block` elements; q: n int8.
void launch_int8_encode(cudaStream_t s, const float* x, size_t n, size_t block, float* scales, int8_t* q);
void launch_int8_decode(cudaStream_t s, const float* scales, const int8_t* q, size_t n, size_t block, float scale, float* y);

// quantized.cu
// words: ceil(n * bits / 32) zeroed 32-bit words; norms: one per bucket.
void launch_qsgd_encode(cudaStream_t s, const float* x, size_t n, size_t bucket, int levels, uint64_t seed, float* norms,
                        uint32_t* words);
void launch_qsgd_decode(cudaStream_t s, const float* norms, const uint8_t* packed, size_t n, size_t bucket, int levels,
                        float scale, float* y);
// words: ceil(n / 32); abs_sum: one zeroed double, receives the sum of |x|.
void launch_sign_encode(cudaStream_t s, const float* x, size_t n, uint32_t* words, double* abs_sum);
void launch_sign_decode(cudaStream_t s, const uint8_t* bits, size_t n, float magnitude, float* y);
// sum: one zeroed double, receives the sum of x[i]^2.
void launch_sum_squares(cudaStream_t s, const float* x, size_t n, double* sum);

// sparse.cu
void launch_abs_sample(cudaStream_t s, const float* x, size_t n, uint64_t seed, size_t m, float* sample);
// The k-th largest |x| (1-based), by sorting a copy of |x| held in `scratch` (n floats).
float kth_largest_abs(cudaStream_t s, const float* x, size_t n, size_t k, float* scratch);
// Writes, in increasing order, every i with |x[i]| >= t and x[i] != 0; returns how many.
size_t select_at_least(cudaStream_t s, const float* x, size_t n, float t, uint32_t* idx);
void launch_gather(cudaStream_t s, const float* x, const uint32_t* idx, size_t k, float* out);
void launch_scatter_add(cudaStream_t s, const uint32_t* idx, const float* v, size_t k, float scale, float* y);
void launch_randomk_gather(cudaStream_t s, const float* x, size_t n, size_t k, uint64_t seed, bool unbiased, float* out);
void launch_randomk_scatter_add(cudaStream_t s, const float* v, size_t n, size_t k, uint64_t seed, float scale, float* y);

}  // namespace hearsay::codec::cuda
