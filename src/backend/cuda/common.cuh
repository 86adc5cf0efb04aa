// Error checks that name the failed statement, its file and line, and the CUDA message.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "hearsay/error.h"

namespace hearsay::cuda {

[[noreturn]] inline void throw_cuda(const char* stmt, const char* file, int line, const char* msg) {
  throw BackendError(std::string("cuda: ") + stmt + " failed at " + file + ":" + std::to_string(line) + ": " + msg);
}

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(size_t n, unsigned block = 256) {
  size_t blocks = (n + block - 1) / block;
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

}  // namespace hearsay::cuda

#define CUDA_CHECK(stmt)                                                                    \
  do {                                                                                      \
    cudaError_t err_ = (stmt);                                                              \
    if (err_ != cudaSuccess) ::hearsay::cuda::throw_cuda(#stmt, __FILE__, __LINE__, cudaGetErrorString(err_)); \
  } while (0)

#define CUBLAS_CHECK(stmt)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (stmt);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::hearsay::cuda::throw_cuda(#stmt, __FILE__, __LINE__, cublasGetStatusString(st_)); \
  } while (0)
