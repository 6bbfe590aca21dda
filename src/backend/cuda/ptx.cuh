// Device helpers shared by the attention-path and mHC kernels: exact scalar decoding, the m16n8k16 and
// m16n8k8 (tf32) tensor-core MMAs, cp.async copies and group control, the bf16 and tf32 hi + lo splits; and the one
// float -> 16-bit activation rounding of every kernel that writes a copy for a GEMV (glue, gemv, moe).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dsv4::cuda::ptx {

// UE8M0 scale 2^(e-127), exactly as the CPU decoder: e = 0 is the denormal 2^-127, 0xff is NaN.
__device__ __forceinline__ float e8m0(uint8_t e) {
  if (e == 0xff) return __int_as_float(0x7fc00000);
  if (e == 0) return __int_as_float(0x00400000);
  return __int_as_float(static_cast<int>(e) << 23);
}

// The bits of f rounded to nearest even as bf16, or as f16 (the FP8 GEMVs' f16 activations,
// cudalin::ActFormat; |f| > 65504 gives inf): the 16-bit copies the decode GEMVs and MoE kernels read.
__device__ __forceinline__ uint16_t act16_bits_rn(float f, bool f16) {
  return f16 ? __half_as_ushort(__float2half_rn(f)) : __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// d += a b on the tensor cores, bf16 (or f16) inputs, fp32 accumulation; row.col fragments as PTX defines.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b on the tensor cores, tf32 operands (fp32 registers with their low 13 bits clear), fp32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 3xTF32 operands of x (a b ~ hi_a hi_b + hi_a lo_b + lo_a hi_b), with integer ops: cvt.rna.tf32.f32 is a
// ~10-instruction sequence on sm_90, which made the splits most of the mHC mix kernel's instructions. hi = x
// rounded to tf32 (half away from zero; low 13 bits clear), lo = x - hi (exact in fp32, |lo| <= 2^-11 |x|)
// truncated to tf32: x = hi + lo + r, |r| <= 2^-21 |x|; with the dropped lo lo term each product is within
// ~2^-20 of fp32's. A non-finite x gives non-finite products.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

// Asynchronous global -> shared copy of kBytes (4, 8 or 16); src_bytes = 0 zero-fills the destination (nothing
// is read). The first form takes a shared-window address (callers that add constant offsets to one base keep
// them as immediates), the second a generic pointer.
template <int kBytes>
__device__ __forceinline__ void cp_async_s(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes), "r"(src_bytes)
               : "memory");
}
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes) {
  cp_async_s<kBytes>(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, src_bytes);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// x = hi + lo + r with hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in fp32), |r| <= 2^-16 |x|; pairs
// packed as bf16x2 (x0 in the low half).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// One thread counts its block in at *counter and says whether it was the `expected`-th (last) arrival. The
// caller has synchronised the block after its global writes: the barrier orders every thread's writes before
// this thread's fence and atomic (release), and the fence after a last arrival (acquire) comes before the block
// barrier the caller places ahead of everyone's reads of the other blocks' writes (which must come from L2:
// __ldcg). Only the counting thread fences, as cooperative groups' grid sync does.
__device__ __forceinline__ bool count_arrival(int* counter, int expected) {
  __threadfence();
  const bool last = atomicAdd(counter, 1) == expected - 1;
  if (last) __threadfence();
  return last;
}

// Whether this block is the last of `expected` blocks to arrive at *counter; the whole block calls it after
// its global writes, with `flag` a __shared__ variable (count_arrival in thread 0 between two barriers). That
// block re-arms the counter (*counter = 0) when it is done, for the next launch or graph replay. (The split-K
// reduction of the GEMVs and the one-token hc_pre kernel; the MoE decode's w2 counts per pair.)
template <typename Flag>
__device__ __forceinline__ bool last_block_to_arrive(int* counter, int expected, Flag& flag) {
  __syncthreads();
  if (threadIdx.x == 0) flag = count_arrival(counter, expected);
  __syncthreads();
  return flag;
}

}  // namespace dsv4::cuda::ptx
