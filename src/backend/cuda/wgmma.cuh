// Hopper warpgroup MMA (wgmma, sm_90a only: callers compile these under __CUDA_ARCH_FEAT_SM90_ALL and dispatch by
// compute capability 9.0). The fences and waits, shared-memory matrix descriptors for the 128-byte swizzle, and the
// instruction shapes the kernels use. PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate".
//
// Layout both descriptor kinds assume (tile_off's layout in the MoE prefill GEMM): a block of rows of 128 bytes
// (64 16-bit elements), 1024-byte aligned, 16-byte chunk c of row r stored at chunk c ^ (r & 7).
//  * K-major (imm-trans = 0): rows are M or N, the 64 elements of a row are k. 8-row groups are SBO = 1024 bytes
//    apart; k 16 kk of row 0 starts at +32 kk bytes (LBO is unused for swizzled K-major layouts).
//  * MN-major (imm-trans = 1; 16-bit types only): rows are k, the 64 elements of a row are N. 8 k-rows are
//    SBO = 1024 bytes apart, and the next 64 N (the next block of rows) LBO bytes further (the canonical layout
//    ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO)) of the PTX ISA's "Shared Memory Matrix Layout").
#pragma once
#include <cstdint>

namespace dsv4::cuda::wgmma {

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed wgmma groups are pending (they complete in order).
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wait0() { wait<0>(); }
// Keeps the compiler from moving reads or writes of an accumulator across the wgmma fence / wait around it.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Generic-proxy writes to shared memory (st.shared, cp.async) visible to the tensor cores' reads; then a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Descriptor of a 128-byte swizzled operand starting at shared address `addr` (see the layout above); lbo is
// only read for MN-major operands.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo = 0) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 | uint64_t(1024 >> 4) << 32 |
         uint64_t(1) << 62;
}

// The inline-asm pieces of the shapes below. An accumulator of N / 2 fp32 registers per thread is the array `d`:
// DSV4_WGMMA_D<k>(i) lists the operands "+f"(d[i]) .. "+f"(d[i + k - 1]); DSV4_WGMMA_R<k> names %0 .. %(k - 1).
#define DSV4_WGMMA_D8(i)                                                                                     \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define DSV4_WGMMA_D16(i) DSV4_WGMMA_D8(i), DSV4_WGMMA_D8((i) + 8)
#define DSV4_WGMMA_D32(i) DSV4_WGMMA_D16(i), DSV4_WGMMA_D16((i) + 16)
#define DSV4_WGMMA_D64(i) DSV4_WGMMA_D32(i), DSV4_WGMMA_D32((i) + 32)
#define DSV4_WGMMA_D128(i) DSV4_WGMMA_D64(i), DSV4_WGMMA_D64((i) + 64)
#define DSV4_WGMMA_R16 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define DSV4_WGMMA_R32 DSV4_WGMMA_R16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define DSV4_WGMMA_R64 DSV4_WGMMA_R32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define DSV4_WGMMA_R128                                                                                     \
  DSV4_WGMMA_R64 ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"                        \
                 ",%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
// wgmma m64 N k16 (N = 2 R), fp32 accumulators, A from four registers, B through a descriptor, with the operands
// after the accumulators: a[0..3] = %R .. %R+3, b = %R+4, accumulate predicate source %R+5, imm-trans-b %R+6.
#define DSV4_WGMMA_RS(N, R, TYPE, A, B, P, T)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" DSV4_WGMMA_R##R "}, {" A \
               "}, " B ", p, 1, 1, " T ";\n}\n"                                                              \
               : DSV4_WGMMA_D##R(0)                                                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1), "n"(TransB))

// wgmma m64 N k16, f16 or bf16 inputs, fp32 accumulators d (accumulating), A from registers (the m16n8k16 A
// fragment of each warp's 16 rows), B from shared memory through descriptor b: K-major (TransB = 0) or MN-major
// (TransB = 1). N = 32, 64, 128 or 256.
template <int N, bool F16, int TransB = 0>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "wgmma::mma_rs: N");
  if constexpr (N == 32) {
    if constexpr (F16) DSV4_WGMMA_RS(32, 16, "f16", "%16,%17,%18,%19", "%20", "%21", "%22");
    else DSV4_WGMMA_RS(32, 16, "bf16", "%16,%17,%18,%19", "%20", "%21", "%22");
  } else if constexpr (N == 64) {
    if constexpr (F16) DSV4_WGMMA_RS(64, 32, "f16", "%32,%33,%34,%35", "%36", "%37", "%38");
    else DSV4_WGMMA_RS(64, 32, "bf16", "%32,%33,%34,%35", "%36", "%37", "%38");
  } else if constexpr (N == 128) {
    if constexpr (F16) DSV4_WGMMA_RS(128, 64, "f16", "%64,%65,%66,%67", "%68", "%69", "%70");
    else DSV4_WGMMA_RS(128, 64, "bf16", "%64,%65,%66,%67", "%68", "%69", "%70");
  } else {
    if constexpr (F16) DSV4_WGMMA_RS(256, 128, "f16", "%128,%129,%130,%131", "%132", "%133", "%134");
    else DSV4_WGMMA_RS(256, 128, "bf16", "%128,%129,%130,%131", "%132", "%133", "%134");
  }
}

// wgmma m64n32k16 bf16 -> f32, A and B from shared memory, both K-major; accumulate = 0 overwrites d.
__device__ __forceinline__ void mma_ss_n32_bf16(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" DSV4_WGMMA_R16 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : DSV4_WGMMA_D16(0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// wgmma m64 N k32, e4m3 x e4m3 -> fp32, A and B from shared memory, both K-major (the only layout FP8 wgmma
// takes); accumulate = 0 overwrites d. N = 32, 64, 128 or 256. The tensor cores keep about 14 bits of the running
// sum of FP8 products (DeepSeek-V3 report, 3.3.2), so callers bound the error by ~2^-13 of sum |products| per
// instruction.
template <int N>
__device__ __forceinline__ void mma_ss_e4m3(float (&d)[N / 2], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "wgmma::mma_ss_e4m3: N");
  if constexpr (N == 32)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {" DSV4_WGMMA_R16 "}, %16, %17, p, 1, 1;\n}\n"
                 : DSV4_WGMMA_D16(0)
                 : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (N == 64)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" DSV4_WGMMA_R32 "}, %32, %33, p, 1, 1;\n}\n"
                 : DSV4_WGMMA_D32(0)
                 : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (N == 128)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" DSV4_WGMMA_R64 "}, %64, %65, p, 1, 1;\n}\n"
                 : DSV4_WGMMA_D64(0)
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" DSV4_WGMMA_R128 "}, %128, %129, p, 1, 1;\n}\n"
                 : DSV4_WGMMA_D128(0)
                 : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace dsv4::cuda::wgmma
