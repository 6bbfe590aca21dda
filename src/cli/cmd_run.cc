// dsv4 run: prefill a prompt, then decode token by token, streaming the output and timing both phases.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/runner.h"
#include "engine/model.h"
#include "engine/sampler.h"
#ifdef DSV4_HAVE_TEXT
#include "text/stream_decoder.h"
#include "text/tokenizer.h"
#endif

namespace dsv4::cli {

static std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument("x");
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      fail("--prompt-ids: '", item, "' is not a token id");
    }
  }
  return ids;
}

int cmd_run(int argc, char** argv) {
  Args a(argc, argv, 2,
         {"model", "prompt", "prompt-ids", "max-tokens", "temperature", "top-k", "top-p", "min-p", "seed",
          "kv-cache-dtype", "chunk", "tokenizer", "device", "max-model-len"},
         {"help", "ids", "quiet", "act-quant", "indexer-fp8-q"});
  if (a.has("help")) {
    std::printf(
        "dsv4 run [--model DIR] (--prompt TEXT | --prompt-ids 0,1,2) [--max-tokens 32]\n"
        "         [--temperature 0] [--top-k 0] [--top-p 1] [--min-p 0] [--seed 0]\n"
        "         [--kv-cache-dtype bf16|fp8|f32] [--chunk N (prefill chunk, 0 = whole prompt;\n"
        "          cuda: N tokens per prefill step, 0 = 2048, 1 = token by token)]\n"
        "         [--device cpu|cuda] [--max-model-len N (cuda: positions to reserve, default 4096)]\n"
        "         [--act-quant (FP8 activations before the FP8 / MXFP4 linears, as DeepSeek's reference; cuda: routed\n"
        "          experts through the fp32 kernels, slower)]\n"
        "         [--indexer-fp8-q (the CSA indexer's q in e4m3 per head, as vLLM; cuda: sm_90 with fp8 KV)]\n"
        "         [--tokenizer tokenizer.json] [--ids (print token ids)] [--quiet]\n");
    return 0;
  }
  RunnerOptions ro;
  ro.kv_dtype = parse_kv_dtype(a.get("kv-cache-dtype", "bf16"));
  ro.device = a.get("device", "cpu");
  ro.act_quant = a.has("act-quant");
  ro.indexer_fp8_q = a.has("indexer-fp8-q");
  ro.max_model_len = a.get_int("max-model-len", 0);
  if (ro.max_model_len < 0) fail("--max-model-len must be >= 0");
  SamplingParams sp;
  sp.temperature = static_cast<float>(a.get_double("temperature", 0.0));
  sp.top_k = static_cast<int>(a.get_int("top-k", 0));
  sp.top_p = static_cast<float>(a.get_double("top-p", 1.0));
  sp.min_p = static_cast<float>(a.get_double("min-p", 0.0));
  sp.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  validate(sp);
  const long long max_tokens = a.get_int("max-tokens", 32);
  if (max_tokens < 0) fail("--max-tokens must be >= 0");
  const long long chunk = a.get_int("chunk", 0);
  if (chunk < 0) fail("--chunk must be >= 0");
  // cuda: 0 (the default) takes prefill steps of kDefaultCudaPrefillChunk tokens rather than one token at a
  // time, which runs at the batch-1 decode rate (V4-Flash width on an H200: ~7,800 against ~140 tok/s,
  // docs/PERFORMANCE.md); the engine checks its own range.
  ro.prefill_chunk = chunk == 0 ? kDefaultCudaPrefillChunk : static_cast<int>(std::min<long long>(chunk, 1 << 30));

  const std::string dir = resolve_model_dir(a.get("model"));
  auto runner = make_runner(dir, ro);
  const ModelConfig& c = runner->config();

  std::vector<int32_t> prompt;
  bool as_text = false;
#ifdef DSV4_HAVE_TEXT
  std::unique_ptr<text::Tokenizer> tok;
  if (!a.has("ids")) {
    tok = std::make_unique<text::Tokenizer>(text::Tokenizer::load(a.get("tokenizer", text::default_tokenizer_path())));
    as_text = true;
  }
#endif
  if (a.has("prompt-ids")) {
    prompt = parse_ids(a.get("prompt-ids"));
  } else if (a.has("prompt")) {
#ifdef DSV4_HAVE_TEXT
    if (!tok) tok = std::make_unique<text::Tokenizer>(text::Tokenizer::load(a.get("tokenizer", text::default_tokenizer_path())));
    prompt.push_back(c.bos_token_id);
    for (int32_t id : tok->encode(a.get("prompt"))) prompt.push_back(id);
#else
    fail("--prompt needs the tokenizer, which this build lacks; use --prompt-ids");
#endif
  } else {
    prompt = {c.bos_token_id};
  }
  if (prompt.empty()) fail("the prompt is empty");
  for (int32_t id : prompt)
    if (id < 0 || id >= c.vocab_size) fail("prompt token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");

  Sampler sampler(sp);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  std::vector<float> last = runner->feed(prompt, static_cast<size_t>(chunk));
  auto t1 = clock::now();
  std::vector<int32_t> out;
#ifdef DSV4_HAVE_TEXT
  std::unique_ptr<text::StreamDecoder> stream;
  if (as_text) stream = std::make_unique<text::StreamDecoder>(*tok);
#endif
  for (long long n = 0; n < max_tokens; ++n) {
    const int32_t next = sampler.sample(last.data(), c.vocab_size);
    out.push_back(next);
    if (as_text) {
#ifdef DSV4_HAVE_TEXT
      const std::string piece = stream->push(next);  // complete UTF-8 only
      std::fwrite(piece.data(), 1, piece.size(), stdout);
#endif
    } else {
      std::printf("%s%d", n ? " " : "", next);
    }
    std::fflush(stdout);
    if (next == c.eos_token_id) break;
    last = runner->feed({next}, 0);
  }
  auto t2 = clock::now();
#ifdef DSV4_HAVE_TEXT
  if (stream) std::fputs(stream->finish().c_str(), stdout);
#endif
  std::printf("\n");
  std::fflush(stdout);  // the text ends before the timing line on a shared terminal or log
  if (!a.has("quiet")) {
    const double pf = std::chrono::duration<double>(t1 - t0).count();
    const double dc = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s (%.1f tok/s)\n",
                 prompt.size(), pf, prompt.size() / std::max(pf, 1e-9), out.size(), dc,
                 out.size() / std::max(dc, 1e-9));
  }
  return 0;
}

}  // namespace dsv4::cli
