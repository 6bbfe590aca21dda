// cudalin::moe_prefill against cpu::moe_forward (the engine's reference), a float64 model of the GPU numerics
// and cudalin::moe_decode (T <= 64). Fresh random inputs each run, outputs NaN-poisoned before launch.
// Routes: random; expert loads of 0, 1 and all tokens (expert 0 in every token, expert 1 in one, 2 in none);
// an expert listed twice per token. T in {1, 65, 300, 4096}; every GEMM tile width (32, 64, 128 tokens).
//
// Bounds (same numerics as moe_decode, docs/GEMM_MOE.md): x is bf16 (given exactly here), weights are
// dequantized exactly, products are exact in fp32 and accumulate in fp32 over K <= 4096 terms, and
// h = silu(min(g, L)) * clamp(u, -L, L) * w is rounded to bf16 (relative <= 2^-9, random sign) before w2.
//   * vs cpu::moe_forward (fp32 h, no bf16 rounding): ||err||/||ref|| ~ 2^-9/sqrt(3) = 1.1e-3: we ask 5e-3.
//   * vs a float64 model rounding h to bf16 the same way: fp32 summation (~sqrt(K) 2^-24 relative, ~1e-6) plus
//     rare one-ulp bf16 flips of h where fp32 g/u sit on a rounding boundary: we ask 2e-4 in norm and
//     2e-3 * max|ref| elementwise (a wrong row, token or expert would be O(max|ref|)).
//   * vs moe_decode: both round h to bf16 from fp32 sums taken in different K orders, so they differ only by
//     those flips and fp32 summation: we ask 2e-4 in norm, like the model.
// Determinism: two launches give bit-identical outputs, so do all tile widths (and kernel 3's mixed tiles of 64
// and 32 against tiles of 64 only) and both pipelines; a CUDA-graph
// replay (no host synchronization inside moe_prefill) with new routes written into the same idx buffer matches
// a direct launch bit for bit.
// moe_prefill_f16 (x and h in f16, weights converted exactly to f16): f16 rounds 8x finer than bf16, so the same
// bounds hold against the float64 model that rounds x and h to f16 (x is given f16-exact here) and against
// moe_decode's f16 path (ActFormat::kF16); each case runs in both formats.
// GEMM kernels 2 (set_moe_prefill_kernel(2): weights converted straight into MMA fragments, another k order inside
// each MMA) and 3 (kernel 2 on wgmma, compute capability 9.0 only; x and h stored in its pair order) are held to
// the same bounds, and each kernel's tile widths to bit-identity among themselves; also with scale arrays at odd
// addresses.
#include <algorithm>
#include <memory>
#include <numeric>
#include <string>

#include "backend/cpu/moe.h"
#include "core/error.h"
#include "linear_test_util.h"
#include "moe_test_util.h"
#include "model/config.h"

namespace dsv4 {
namespace {

using namespace lintest;

// The GEMM kernels to test: 1 and 2 everywhere, 3 (wgmma) on compute capability 9.0.
std::vector<int> gemm_kernels() {
  cudaDeviceProp p{};
  ok(cudaGetDeviceProperties(&p, 0), "device properties");
  if (p.major == 9 && p.minor == 0) return {1, 2, 3};
  return {1, 2};
}

// Where kernel 3 stores element k of an h row (its pair order, docs/GEMM_MOE.md "Kernel 3"): in each 64-wide block,
// real pair p = 8 t + 2 kk + h sits at pair 8 kk + 4 h + t.
int kernel3_pos(int k) {
  const int p = (k & 63) >> 1, t = p >> 3, kk = (p >> 1) & 3, h = p & 1;
  return (k & ~63) + 2 * (8 * kk + 4 * h + t) + (k & 1);
}

struct Inputs {
  std::vector<float> xf, wts;
  std::vector<uint16_t> xb;
  std::vector<int32_t> idx;
};
// xb: the 16-bit bits of x (f16 when f16, else bf16), xf: their exact values.
Inputs make_inputs(std::mt19937_64& rng, const cudalin::MoeShape& s, int T, Route route, float x_scale, bool f16 = false) {
  Inputs in;
  random_bf16(rng, size_t(T) * s.hidden, in.xf, in.xb);
  for (size_t i = 0; i < in.xf.size(); ++i) {
    if (f16) in.xb[i] = f32_to_f16(in.xf[i] * x_scale), in.xf[i] = f16_to_f32(in.xb[i]);
    else in.xb[i] = f32_to_bf16(in.xf[i] * x_scale), in.xf[i] = bf16_to_f32(in.xb[i]);
  }
  in.idx = make_routes(rng, route, T, s);
  in.wts.resize(in.idx.size());
  std::uniform_real_distribution<float> wd(0.05f, 0.5f);
  for (auto& w : in.wts) w = wd(rng);
  return in;
}

// Runs moe_prefill, or moe_prefill_f16 on the fp32 x when f16 (tile width tile_n, 0 = heuristic), and returns
// out - prior.
std::vector<float> run_prefill(const cudalin::MoeShape& s, const Experts& X, const Inputs& in, int T, bool accumulate,
                               int tile_n, const std::vector<float>& prior, cudalin::MoePrefillWorkspace& ws,
                               bool f16 = false) {
  DevBuf<uint16_t> dx(in.xb);
  DevBuf<float> dxf(in.xf);
  DevBuf<int32_t> didx(in.idx);
  DevBuf<float> dw(in.wts), dout(size_t(T) * s.hidden);
  if (accumulate) dout.upload(prior);
  else dout.poison();
  ok(cudaMemset(ws.h, 0xFF, size_t(T) * s.top_k * s.inter * 2), "poison h");
  ok(cudaMemset(ws.ybuf, 0xFF, size_t(T) * s.top_k * s.hidden * 4), "poison ybuf");
  ok(cudaMemset(ws.perm, 0xFF, size_t(T) * s.top_k * 4), "poison perm");
  cudalin::set_moe_prefill_tile_n(tile_n);
  if (f16) cudalin::moe_prefill_f16(s, X.dev->p, dxf.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr);
  else cudalin::moe_prefill(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, ws, nullptr);
  cudalin::set_moe_prefill_tile_n(0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = dout.download();
  if (accumulate)
    for (size_t i = 0; i < got.size(); ++i) got[i] -= prior[i];
  return got;
}

// The permutation (counts, offsets, pairs sorted by (expert, t, k)) against the host's, and h at a few
// permuted positions against float64 (isolates the routing, the w1/w3 GEMM and the w2 GEMM when one fails).
void check_internals(const cudalin::MoeShape& s, const Experts& X, const Inputs& in, int T,
                     const cudalin::MoePrefillWorkspace& ws, bool f16, bool h_kernel3_order) {
  const int P = T * s.top_k, E = s.n_experts;
  std::vector<int> counts(E), offsets(E + 1), perm(P);
  ok(cudaMemcpy(counts.data(), ws.counts, E * 4, cudaMemcpyDeviceToHost), "counts");
  ok(cudaMemcpy(offsets.data(), ws.offsets, (E + 1) * 4, cudaMemcpyDeviceToHost), "offsets");
  ok(cudaMemcpy(perm.data(), ws.perm, P * 4, cudaMemcpyDeviceToHost), "perm");
  std::vector<int> want(P);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int a, int b) { return in.idx[a] < in.idx[b]; });
  std::vector<int> wc(E, 0);
  for (int p = 0; p < P; ++p) ++wc[in.idx[p]];
  EXPECT_EQ(counts, wc) << "expert counts";
  int off = 0;
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(offsets[e], off) << "offset of expert " << e;
    off += wc[e];
  }
  EXPECT_EQ(offsets[E], P);
  EXPECT_EQ(perm, want) << "pairs not sorted by (expert, t, k)";
  std::vector<uint16_t> h(size_t(P) * s.inter);
  ok(cudaMemcpy(h.data(), ws.h, h.size() * 2, cudaMemcpyDeviceToHost), "h");
  for (int pos : {0, P / 2, P - 1}) {
    const int p = want[pos], t = p / s.top_k, e = in.idx[p];
    double num = 0, den = 0;
    for (int i = 0; i < s.inter; ++i) {
      double g = 0, u = 0;
      for (int d = 0; d < s.hidden; ++d) {
        g += double(in.xf[size_t(t) * s.hidden + d]) * X.W1[e][size_t(i) * s.hidden + d];
        u += double(in.xf[size_t(t) * s.hidden + d]) * X.W3[e][size_t(i) * s.hidden + d];
      }
      const double L = s.swiglu_limit;
      if (L > 0) g = std::min(g, L), u = std::clamp(u, -L, L);
      const double ref = g / (1.0 + std::exp(-g)) * u * in.wts[p];
      const uint16_t hb = h[size_t(pos) * s.inter + (h_kernel3_order ? kernel3_pos(i) : i)];
      const double d = (f16 ? f16_to_f32(hb) : bf16_to_f32(hb)) - ref;
      num += d * d, den += ref * ref;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    if (rel > 4e-3) std::printf("  h at position %d (pair %d, expert %d): rel err %.3g\n", pos, p, e, rel);
    EXPECT_LE(rel, 4e-3) << "h at permuted position " << pos;  // bf16 rounding: ~2^-9/sqrt(3) (f16: 8x less)
  }
}

void run_case_in(const cudalin::MoeShape& s, int T, Route route, float x_scale, bool accumulate, uint64_t salt,
                 bool vs_decode, bool f16) {
  SCOPED_TRACE(::testing::Message() << "hidden " << s.hidden << " inter " << s.inter << " E " << s.n_experts << " T "
                                    << T << " route " << int(route) << " x_scale " << x_scale << " f16 " << f16);
  std::mt19937_64 rng(seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  Experts X = make_experts(rng, s);
  const Inputs in = make_inputs(rng, s, T, route, x_scale, f16);
  if (f16) {
    ASSERT_TRUE(cudalin::moe_scales_fit_f16(s, X.dev->p, nullptr)) << "test experts' scales outside [104, 136]";
  }
  std::vector<float> prior(size_t(T) * s.hidden, 0.f);
  if (accumulate) {
    std::normal_distribution<float> nd;
    for (auto& p : prior) p = nd(rng);
  }

  // References.
  const std::vector<double> cpu_d = cpu_moe(s, X, in.xf, T, in.idx, in.wts);
  const std::vector<double> model = model_moe(s, X, in.xf, T, in.idx, in.wts, f16);
  const std::vector<double> ones(model.size(), 1.0);
  double maxref = 0;
  for (double v : model) maxref = std::max(maxref, std::fabs(v));

  cudalin::MoePrefillWorkspace ws = cudalin::moe_prefill_workspace_create(s, T);
  std::vector<float> first[4];  // by GEMM kernel: its default tile width's output
  for (int kernel : gemm_kernels())
    for (int pipe : {0, 1})
      for (int tile_n : {0, 32, 64, 128}) {
        if ((f16 || kernel != 1) && pipe == 1) continue;  // the opt-in pipeline exists for kernel 1 in bf16 only
        cudalin::set_moe_prefill_kernel(kernel);
        cudalin::set_moe_prefill_pipeline(pipe);
        const std::vector<float> got = run_prefill(s, X, in, T, accumulate, tile_n, prior, ws, f16);
        cudalin::set_moe_prefill_pipeline(0);
        const ErrStats ec = compare(got, cpu_d, ones), em = compare(got, model, ones);
        std::printf("moe_prefill%s hidden=%d inter=%d E=%d T=%d route=%d kernel=%d pipe=%d tile=%d: vs cpu::moe_forward "
                    "%.3g, vs float64 model %.3g, max err/max|ref| %.3g\n", f16 ? "_f16" : "", s.hidden, s.inter,
                    s.n_experts, T, int(route), kernel, pipe, tile_n, ec.rel_norm, em.rel_norm,
                    em.worst / std::max(maxref, 1e-300));
        const std::string what = "kernel " + std::to_string(kernel) + " pipe " + std::to_string(pipe) + " tile " +
                                 std::to_string(tile_n);
        EXPECT_EQ(em.non_finite, 0) << "unwritten or non-finite outputs, " << what;
        EXPECT_LE(ec.rel_norm, 5e-3) << what;
        EXPECT_LE(em.rel_norm, 2e-4) << what;
        EXPECT_LE(em.worst, 2e-3 * maxref) << what;
        if (em.rel_norm > 2e-4) {  // diagnostics: the first few elements far off
          int shown = 0;
          for (size_t i = 0; i < got.size() && shown < 4; ++i)
            if (!(std::fabs(got[i] - model[i]) <= 1e-2 * maxref)) {
              std::printf("  bad out[t=%zu, d=%zu] = %g, model %g\n", i / s.hidden, i % s.hidden, got[i], model[i]);
              ++shown;
            }
        }
        if (kernel == 3 && tile_n == 64) {  // mixed tiles (set_moe_prefill_mixed_tiles) against tiles of 64 only
          const bool mixed = cudalin::moe_prefill_mixed_tiles();
          cudalin::set_moe_prefill_mixed_tiles(!mixed);
          const std::vector<float> other = run_prefill(s, X, in, T, accumulate, 64, prior, ws, f16);
          cudalin::set_moe_prefill_mixed_tiles(mixed);
          EXPECT_EQ(std::memcmp(got.data(), other.data(), got.size() * 4), 0) << "mixed tiles differ, " << what;
        }
        if (pipe == 0 && tile_n == 0) {
          check_internals(s, X, in, T, ws, f16, kernel == 3);
          first[kernel] = got;
          const std::vector<float> again = run_prefill(s, X, in, T, accumulate, 0, prior, ws, f16);
          EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "not bit-reproducible, " << what;
        } else {
          // Every output element sees the same MMA sequence over K whatever the tile width or pipeline, so the
          // results of one kernel are bit-identical (measured on the H200 for the tile widths, 2026-11-30).
          const bool same = std::memcmp(first[kernel].data(), got.data(), got.size() * 4) == 0;
          std::printf("moe_prefill%s kernel=%d pipe=%d tile=%d bit-identical to the default: %s\n", f16 ? "_f16" : "",
                      kernel, pipe, tile_n, same ? "yes" : "no");
          EXPECT_TRUE(same) << what << " differs from the kernel's default";
        }
        cudalin::set_moe_prefill_kernel(0);
      }
  // The default: kernel 3 on compute capability 9.0; elsewhere by tile width, kernel 2 at tiles of 32, kernel 1
  // at 128, one of them by heuristic.
  cudalin::set_moe_prefill_kernel(0);
  const bool k3 = gemm_kernels().size() == 3;
  for (int tile_n : {0, 32, 128}) {
    const std::vector<float> got = run_prefill(s, X, in, T, accumulate, tile_n, prior, ws, f16);
    auto same = [&](int k) { return std::memcmp(first[k].data(), got.data(), got.size() * 4) == 0; };
    const bool ok = k3 ? same(3) : tile_n == 32 ? same(2) : tile_n == 128 ? same(1) : same(1) || same(2);
    std::printf("moe_prefill%s default kernel tile=%d bit-identical to its kernel: %s\n", f16 ? "_f16" : "", tile_n,
                ok ? "yes" : "no");
    EXPECT_TRUE(ok) << "default kernel at tile " << tile_n;
  }
  cudalin::set_moe_prefill_kernel(0);
  cudalin::moe_prefill_workspace_destroy(ws);

  if (vs_decode) {  // moe_decode on the same inputs
    DevBuf<uint16_t> dx(in.xb);
    DevBuf<int32_t> didx(in.idx);
    DevBuf<float> dw(in.wts), dout(size_t(T) * s.hidden);
    if (accumulate) dout.upload(prior);
    else dout.poison();
    cudalin::MoeWorkspace dws = cudalin::moe_workspace_create(s, T);
    cudalin::moe_decode(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, accumulate, dws, nullptr,
                        f16 ? cudalin::ActFormat::kF16 : cudalin::ActFormat::kBf16);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudalin::moe_workspace_destroy(dws);
    std::vector<float> dec = dout.download();
    if (accumulate)
      for (size_t i = 0; i < dec.size(); ++i) dec[i] -= prior[i];
    const std::vector<double> dec_d(dec.begin(), dec.end());
    for (int kernel : gemm_kernels()) {
      const ErrStats ed = compare(first[kernel], dec_d, ones);
      std::printf("moe_prefill%s kernel %d vs moe_decode T=%d: rel %.3g, max err/max|ref| %.3g\n", f16 ? "_f16" : "",
                  kernel, T, ed.rel_norm, ed.worst / std::max(maxref, 1e-300));
      EXPECT_EQ(ed.non_finite, 0) << "kernel " << kernel;
      EXPECT_LE(ed.rel_norm, 2e-4) << "kernel " << kernel;
      EXPECT_LE(ed.worst, 2e-3 * maxref) << "kernel " << kernel;
    }
  }
}

// Each case in bf16 (moe_prefill) and in f16 (moe_prefill_f16), on separate fresh inputs.
void run_case(const cudalin::MoeShape& s, int T, Route route, float x_scale, bool accumulate, uint64_t salt,
              bool vs_decode = false) {
  run_case_in(s, T, route, x_scale, accumulate, salt, vs_decode, false);
  run_case_in(s, T, route, x_scale, accumulate, salt ^ 0xF16, vs_decode, true);
}

TEST(CudaMoePrefill, RandomRoutes) {
  DSV4_REQUIRE_GPU();
  for (int T : {1, 65, 300}) run_case(small_shape(), T, Route::kRandom, 1.f, false, 10 + T);
}

TEST(CudaMoePrefill, ExpertLoadsZeroOneAll) {
  DSV4_REQUIRE_GPU();
  for (int T : {1, 65, 300, 4096}) run_case(small_shape(), T, Route::kLoads01All, 1.f, false, 100 + T);
}

TEST(CudaMoePrefill, ExpertListedTwicePerToken) {
  DSV4_REQUIRE_GPU();
  run_case(small_shape(), 65, Route::kDuplicate, 1.f, false, 200);
}

TEST(CudaMoePrefill, ClampAndAccumulate) {
  DSV4_REQUIRE_GPU();
  run_case(small_shape(), 300, Route::kRandom, 12.f, true, 300);  // |g|, |u| past the clamp at 10
}

TEST(CudaMoePrefill, SameAsDecode) {
  DSV4_REQUIRE_GPU();
  for (int T : {1, 17, 64}) run_case(small_shape(), T, Route::kRandom, 1.f, false, 500 + T, true);
  run_case(small_shape(), 64, Route::kLoads01All, 1.f, false, 600, true);
}

TEST(CudaMoePrefill, FullFlashWidth) {
  DSV4_REQUIRE_GPU();
  cudalin::MoeShape s;  // hidden 4096, inter 2048 (V4-Flash); 10 experts keep the CPU reference quick (the
  s.n_experts = 10;     // 0/1/all route leaves 7 >= top_k experts for the other slots)
  run_case(s, 65, Route::kLoads01All, 1.f, false, 400);
  run_case(s, 16, Route::kRandom, 1.f, false, 401, true);
}

// Captured into a CUDA graph (fails if moe_prefill synchronized with or read from the host), replayed after
// new routes and weights are written into the same device buffers: bit-identical to a direct launch.
void graph_replay(bool f16, int kernel) {
  cudalin::set_moe_prefill_kernel(kernel);
  const cudalin::MoeShape s = small_shape();
  const int T = 300;
  std::mt19937_64 rng(seed() ^ 0x5151);
  Experts X = make_experts(rng, s);
  const Inputs a = make_inputs(rng, s, T, Route::kRandom, 1.f, f16), b = make_inputs(rng, s, T, Route::kLoads01All, 1.f, f16);
  DevBuf<uint16_t> dx(a.xb);
  DevBuf<float> dxf(a.xf);
  DevBuf<int32_t> didx(a.idx);
  DevBuf<float> dw(a.wts), dout(size_t(T) * s.hidden);
  cudalin::MoePrefillWorkspace ws = cudalin::moe_prefill_workspace_create(s, T);
  cudaStream_t st;
  ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
  if (f16) cudalin::moe_prefill_f16(s, X.dev->p, dxf.p, didx.p, dw.p, T, dout.p, false, ws, st);
  else cudalin::moe_prefill(s, X.dev->p, dx.p, didx.p, dw.p, T, dout.p, false, ws, st);
  ok(cudaStreamEndCapture(st, &graph), "end capture");
  ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  // Replay on inputs b.
  dx.upload(b.xb), dxf.upload(b.xf), didx.upload(b.idx), dw.upload(b.wts);
  dout.poison();
  ok(cudaGraphLaunch(exec, st), "graph launch");
  ok(cudaStreamSynchronize(st), "graph sync");
  const std::vector<float> via_graph = dout.download();
  const std::vector<float> direct = run_prefill(s, X, b, T, false, 0, {}, ws, f16);
  EXPECT_EQ(std::memcmp(via_graph.data(), direct.data(), direct.size() * 4), 0) << "graph replay differs";
  const std::vector<double> model = model_moe(s, X, b.xf, T, b.idx, b.wts, f16);
  const ErrStats em = compare(via_graph, model, std::vector<double>(model.size(), 1.0));
  std::printf("moe_prefill%s graph replay T=%d, kernel %d: vs float64 model %.3g\n", f16 ? "_f16" : "", T, kernel,
              em.rel_norm);
  EXPECT_EQ(em.non_finite, 0);
  EXPECT_LE(em.rel_norm, 2e-4);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cudalin::moe_prefill_workspace_destroy(ws);
  cudalin::set_moe_prefill_kernel(0);
}

TEST(CudaMoePrefill, GraphReplay) {
  DSV4_REQUIRE_GPU();
  for (int kernel : gemm_kernels()) {
    graph_replay(false, kernel);
    graph_replay(true, kernel);
  }
}

// Scale arrays at odd addresses (the engine's are cudaMalloc-aligned; a kernel that copied scale words would
// need a fallback): every kernel reads them byte by byte and still matches the float64 model.
TEST(CudaMoePrefill, MisalignedScales) {
  DSV4_REQUIRE_GPU();
  const cudalin::MoeShape s = small_shape();
  const int T = 300;
  for (bool f16 : {false, true}) {
    std::mt19937_64 rng(seed() ^ 0xA11C ^ f16);
    Experts X = make_experts(rng, s, 119, 120, /*scale_offset=*/1);
    const Inputs in = make_inputs(rng, s, T, Route::kRandom, 1.f, f16);
    const std::vector<double> model = model_moe(s, X, in.xf, T, in.idx, in.wts, f16);
    cudalin::MoePrefillWorkspace ws = cudalin::moe_prefill_workspace_create(s, T);
    std::vector<float> got[4];
    for (int kernel : gemm_kernels()) {
      cudalin::set_moe_prefill_kernel(kernel);
      got[kernel] = run_prefill(s, X, in, T, false, 0, {}, ws, f16);
      const ErrStats em = compare(got[kernel], model, std::vector<double>(model.size(), 1.0));
      std::printf("moe_prefill%s misaligned scales, kernel %d: vs float64 model %.3g\n", f16 ? "_f16" : "", kernel,
                  em.rel_norm);
      EXPECT_EQ(em.non_finite, 0) << "kernel " << kernel;
      EXPECT_LE(em.rel_norm, 2e-4) << "kernel " << kernel;
    }
    cudalin::set_moe_prefill_kernel(0);
    cudalin::moe_prefill_workspace_destroy(ws);
  }
}

TEST(CudaMoePrefill, ShapeErrors) {
  DSV4_REQUIRE_GPU();
  cudalin::MoeShape s = small_shape();
  s.hidden = 1000;
  EXPECT_THROW(cudalin::moe_prefill_workspace_create(s, 8), Error);
  EXPECT_THROW(cudalin::set_moe_prefill_tile_n(48), Error);
  EXPECT_THROW(cudalin::set_moe_prefill_kernel(4), Error);
  EXPECT_THROW(cudalin::set_moe_prefill_kernel(-1), Error);
  cudalin::MoePrefillWorkspace ws = cudalin::moe_prefill_workspace_create(small_shape(), 8);
  EXPECT_THROW(cudalin::moe_prefill(small_shape(), nullptr, nullptr, nullptr, nullptr, 9, nullptr, false, ws, nullptr),
               Error);
  EXPECT_THROW(cudalin::moe_prefill_f16(small_shape(), nullptr, nullptr, nullptr, nullptr, 9, nullptr, false, ws, nullptr),
               Error);
  EXPECT_THROW(cudalin::moe_prefill_f16(small_shape(), nullptr, nullptr, nullptr, nullptr, 8, nullptr, false, ws, nullptr),
               Error);  // x null
  cudalin::moe_prefill_workspace_destroy(ws);
}

}  // namespace
}  // namespace dsv4
