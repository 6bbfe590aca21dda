// The memory plan (engine/memory_plan.h) against what GpuModel takes from the device: the drop in free device
// memory from before the load to after steps that reach every allocation (a chunked prefill step of more
// than 64 tokens: cuBLAS handles, the bf16 weight copy, the MoE prefill workspace; decode steps replayed from
// CUDA graphs) must stay within plan.total(max_model_len, max_seqs), the figure the load checks against free
// memory. Cases: a prefill chunk of 8192 at 1M positions (the indexer's score rows alone are 8 GiB, above the
// old fixed 8K-token allowance), and plain decode steps. A process of its own, so nothing allocated by other
// tests hides in the baseline. SKIPs without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/memory_plan.h"
#include "model/weights.h"
#include "attention_width_model.h"
#include "gpu_available.h"

namespace dsv4 {
namespace {

size_t free_device_bytes() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  return free_b;
}

void check_plan_covers(const std::string& dir, int max_seqs, int64_t max_model_len, int chunk, int prompt_len) {
  SCOPED_TRACE("max_seqs " + std::to_string(max_seqs) + ", max_model_len " + std::to_string(max_model_len) +
               ", prefill chunk " + std::to_string(chunk));
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context exists before the baseline
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const size_t before = free_device_bytes();
  gpu::GpuOptions o;
  o.max_seqs = max_seqs;
  o.max_model_len = max_model_len;
  o.prefill_chunk = chunk;
  size_t used = 0;
  MemoryPlan plan;
  {
    auto m = gpu::GpuModel::load(dir, o);
    plan = m->memory_plan();  // the plan the load checked
    EXPECT_EQ(plan.step.step_tokens, max_seqs + (chunk > 1 ? chunk : 0));
    std::vector<std::unique_ptr<gpu::GpuSequence>> seqs;
    std::vector<gpu::GpuSeqChunk> b(static_cast<size_t>(max_seqs));
    for (int i = 0; i < max_seqs; ++i) {
      seqs.push_back(m->new_sequence());
      b[i].seq = seqs.back().get();
      b[i].tokens = testing::lcg_prompt(i == 0 ? prompt_len : 3, 11 + static_cast<uint32_t>(i));
      b[i].return_logits = false;
    }
    for (int step = 0; step < 8; ++step) {  // the prompts, then decode steps (graphs from the second on)
      m->forward(b);
      for (auto& ch : b) {
        ASSERT_GE(ch.next_token, 0) << ch.error;
        ch.tokens = {ch.next_token};
      }
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    used = before - free_device_bytes();
    std::printf("max_seqs %d, max_model_len %lld, chunk %d: the device gave %.3f GiB (weights %.3f, state %.3f); the "
                "plan says %.3f GiB (weights %.3f, KV %.3f, workspace %.3f for steps of %lld tokens)\n",
                max_seqs, static_cast<long long>(max_model_len), chunk, used / 1073741824.0,
                m->weight_bytes() / 1073741824.0, m->state_bytes() / 1073741824.0,
                plan.total(max_model_len, max_seqs) / 1073741824.0, plan.device_weights / 1073741824.0,
                plan.kv(max_model_len, max_seqs) / 1073741824.0, plan.workspace_at(max_model_len) / 1073741824.0,
                static_cast<long long>(plan.step.step_tokens));
    EXPECT_LE(m->weight_bytes(), plan.device_weights);
    EXPECT_GE(m->weight_bytes() + 64 * kDeviceExpertTableBytes, plan.device_weights);  // 4 layers x 16 experts
    EXPECT_LE(m->state_bytes(), plan.kv(max_model_len, max_seqs));
  }
  EXPECT_LE(used, plan.total(max_model_len, max_seqs));
  // Not wildly above either: the plan's bounds plus its 512 MiB allowance for library handles.
  EXPECT_LE(plan.total(max_model_len, max_seqs), used + used / 4 + (size_t{1} << 30));
}

TEST(GpuMemoryPlan, CoversWhatTheEngineAllocates) {
  DSV4_REQUIRE_GPU();
  const std::string dir = (std::filesystem::temp_directory_path() / "dsv4_test_gpu_memory_plan").string();
  testing::write_gpu_engine_test_model(5150, true, dir);
  check_plan_covers(dir, 4, int64_t{1} << 20, 8192, 300);  // score rows: 8196 tokens x 1 MiB
  check_plan_covers(dir, 64, 65536, 0, 3);                  // decode steps of 64 tokens
  check_plan_covers(dir, 2, 4096, 512, 600);                // the CLI's default chunk, two chunked steps
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4
