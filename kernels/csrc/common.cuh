// Shared device helpers for the DDTree kernels: input decoding, (value, id) ordering, checks.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ddtree {

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

// Logits arrive as fp32, bf16 or fp16; the kernels read raw storage and decode to fp32 exactly.
enum class InKind { F32, BF16, F16 };

template <InKind K> struct Storage;
template <> struct Storage<InKind::F32> { using T = float; };
template <> struct Storage<InKind::BF16> { using T = uint16_t; };
template <> struct Storage<InKind::F16> { using T = uint16_t; };

template <InKind K>
__device__ __forceinline__ float decode(typename Storage<K>::T raw) {
  if constexpr (K == InKind::F32) {
    return raw;
  } else if constexpr (K == InKind::BF16) {
    return __uint_as_float(static_cast<uint32_t>(raw) << 16);
  } else {
    return __half2float(__ushort_as_half(raw));
  }
}

// Decode one 16-byte vector into VEC floats (VEC = 4 for fp32, 8 for 16-bit types).
template <InKind K>
__device__ __forceinline__ void decode_vec(const uint4& v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (K == InKind::F32) {
      out[i] = __uint_as_float(w[i]);
    } else {
      out[2 * i] = decode<K>(static_cast<uint16_t>(w[i] & 0xffffu));
      out[2 * i + 1] = decode<K>(static_cast<uint16_t>(w[i] >> 16));
    }
  }
}

// Total order used for "best first": larger value, then smaller id.
__device__ __forceinline__ bool better(float v, int id, float w, int jd) {
  return v > w || (v == w && id < jd);
}

inline InKind in_kind(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return InKind::F32;
    case at::kBFloat16: return InKind::BF16;
    case at::kHalf: return InKind::F16;
    default: TORCH_CHECK(false, "ddtree: logits must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

inline void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "ddtree: ", name, " must be a CUDA tensor");
}

// An input's device (the op's first input's: a kernel launched there cannot read another GPU's
// memory), dtype, shape and layout, as the kernels read it.
inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                         at::IntArrayRef shape, const at::Device& device) {
  check_cuda(t, name);
  TORCH_CHECK(t.device() == device, "ddtree: ", name, " must be on ", device, " with the op's other inputs, got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, "ddtree: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, "ddtree: ", name, " must have shape ", shape, ", got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "ddtree: ", name, " must be contiguous");
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace ddtree
