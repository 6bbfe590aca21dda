// Bad input gets a clear error naming the file, tensor or field: one test per malformed checkpoint or
// config case. Each starts from a valid random checkpoint of the default config and breaks one thing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "core/error.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { write_random_checkpoint(default_model_config_json(), dir.str(), RandomCheckpointOptions{}); }

  // Expects Checkpoint::open to throw an Error whose message contains every piece.
  void expect_error(std::initializer_list<std::string> pieces) {
    try {
      Checkpoint::open(dir.str());
      FAIL() << "no error";
    } catch (const Error& e) {
      for (const auto& p : pieces) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }

  // Rewrites a shard with `edit` applied to its tensor list.
  template <typename Edit>
  void rewrite_shard(const std::string& shard, Edit edit) {
    std::vector<TensorBlob> blobs;
    {
      auto f = SafetensorsFile::open(dir.str() + "/" + shard);
      for (const auto& [name, v] : f->tensors())
        blobs.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
    }
    edit(blobs);
    std::vector<const TensorBlob*> ptrs;
    for (const auto& b : blobs) ptrs.push_back(&b);
    write_safetensors(dir.str() + "/" + shard, ptrs);
  }

  void edit_config(const std::function<void(json&)>& edit) {
    std::ifstream in(dir.path() / "config.json");
    json j = json::parse(in);
    in.close();
    edit(j);
    std::ofstream(dir.path() / "config.json") << j.dump(1);
  }

  testing::TempDir dir{"badck"};
};

TEST_F(BadCheckpoint, ValidCheckpointLoads) { EXPECT_NO_THROW(Checkpoint::open(dir.str())); }

TEST(Checkpoint, SingleFileWithoutIndexLoads) {
  testing::TempDir d("single");
  RandomCheckpointOptions opt;
  opt.shards = 1;
  write_random_checkpoint(default_model_config_json(), d.str(), opt);
  fs::rename(d.path() / "model-00001-of-00001.safetensors", d.path() / "model.safetensors");
  fs::remove(d.path() / "model.safetensors.index.json");
  auto ck = Checkpoint::open(d.str());
  EXPECT_TRUE(ck->has("mtp.0.e_proj.weight"));
  EXPECT_EQ(ck->files().size(), 1u);
}

TEST_F(BadCheckpoint, MissingShard) {
  fs::remove(dir.path() / kShard2);
  expect_error({"shard model-00002-of-00002.safetensors is missing", "model.safetensors.index.json"});
}

TEST_F(BadCheckpoint, TruncatedFile) {
  fs::resize_file(dir.path() / kShard2, fs::file_size(dir.path() / kShard2) - 100);
  expect_error({kShard2, "truncated"});
}

TEST_F(BadCheckpoint, FileShorterThanItsHeaderLength) {
  fs::resize_file(dir.path() / kShard1, 4);
  expect_error({kShard1, "truncated safetensors file"});
}

TEST_F(BadCheckpoint, HeaderLengthBeyondFile) {
  std::fstream f(dir.path() / kShard1, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t huge = 1ull << 40;
  f.write(reinterpret_cast<const char*>(&huge), 8);
  f.close();
  expect_error({kShard1, "header length", "exceeds file size"});
}

TEST_F(BadCheckpoint, MalformedHeaderJson) {
  std::fstream f(dir.path() / kShard1, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("{\"x\": [", 7);
  f.close();
  expect_error({kShard1, "malformed safetensors header"});
}

TEST_F(BadCheckpoint, UnknownDtypeInHeader) {
  std::string path = (dir.path() / kShard1).string();
  auto bytes = testing::read_file<char>(path);
  std::string s(bytes.begin(), bytes.end());
  size_t at = s.find("\"BF16\"");
  ASSERT_NE(at, std::string::npos);
  s.replace(at, 6, "\"BF17\"");
  std::ofstream(path, std::ios::binary) << s;
  expect_error({kShard1, "unknown dtype 'BF17'"});
}

TEST_F(BadCheckpoint, WrongDtype) {
  rewrite_shard(kShard1, [](std::vector<TensorBlob>& b) {
    for (auto& t : b)
      if (t.name == "layers.0.attn.wq_a.weight") {
        t.dtype = DType::kI8;  // same byte size as e4m3
      }
  });
  expect_error({kShard1, "tensor layers.0.attn.wq_a.weight has dtype I8, expected F8_E4M3"});
}

TEST_F(BadCheckpoint, WrongShape) {
  rewrite_shard(kShard1, [](std::vector<TensorBlob>& b) {
    for (auto& t : b)
      if (t.name == "norm.weight") {
        t.shape = {64, 2};
      }
  });
  expect_error({kShard1, "tensor norm.weight has shape [64, 2], expected [128]"});
}

TEST_F(BadCheckpoint, ByteCountDisagreesWithShape) {
  std::string path = (dir.path() / kShard1).string();
  auto bytes = testing::read_file<char>(path);
  std::string s(bytes.begin(), bytes.end());
  size_t at = s.find("\"norm.weight\"");
  ASSERT_NE(at, std::string::npos);
  size_t shp = s.find("[128]", at);
  ASSERT_NE(shp, std::string::npos);
  s.replace(shp, 5, "[127]");
  std::ofstream(path, std::ios::binary) << s;
  expect_error({kShard1, "tensor norm.weight", "data bytes for BF16 [127]"});
}

TEST_F(BadCheckpoint, MissingTensor) {
  rewrite_shard(kShard1, [](std::vector<TensorBlob>& b) {
    std::erase_if(b, [](const TensorBlob& t) { return t.name == "layers.1.attn.indexer.weights_proj.weight"; });
  });
  std::ifstream in(dir.path() / "model.safetensors.index.json");
  json j = json::parse(in);
  in.close();
  j["weight_map"].erase("layers.1.attn.indexer.weights_proj.weight");
  std::ofstream(dir.path() / "model.safetensors.index.json") << j.dump();
  expect_error({"missing tensor layers.1.attn.indexer.weights_proj.weight"});
}

TEST_F(BadCheckpoint, IndexNamesATensorTheShardLacks) {
  rewrite_shard(kShard1, [](std::vector<TensorBlob>& b) {
    std::erase_if(b, [](const TensorBlob& t) { return t.name == "hc_head_base"; });
  });
  expect_error({kShard1, "tensor hc_head_base is listed in the index but not in this file"});
}

TEST_F(BadCheckpoint, HashTableWithAnExpertOutOfRange) {
  rewrite_shard(kShard1, [](std::vector<TensorBlob>& b) {
    for (auto& t : b)
      if (t.name == "layers.0.ffn.gate.tid2eid") {
        int64_t bad = 99;
        std::memcpy(t.bytes.data() + 8 * 5, &bad, 8);
      }
  });
  auto ck = Checkpoint::open(dir.str());
  try {
    bind_weights(*ck);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.ffn.gate.tid2eid holds expert id 99"), std::string::npos) << e.what();
  }
}

TEST_F(BadCheckpoint, NoConfig) {
  fs::remove(dir.path() / "config.json");
  expect_error({"config.json: cannot open config"});
}

TEST_F(BadCheckpoint, NotADirectory) {
  try {
    Checkpoint::open(dir.str() + "/nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a checkpoint directory"), std::string::npos);
  }
}

TEST_F(BadCheckpoint, ConfigThatDisagreesWithTheTensors) {
  edit_config([](json& j) { j["moe_intermediate_size"] = 96; });
  expect_error({"checkpoint does not match config.json", "has shape [64, 64], expected [96, 64]"});
}

// Config errors name the file and the field.
struct ConfigCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;
};

class BadConfig : public ::testing::TestWithParam<int> {};

const std::vector<ConfigCase>& config_cases() {
  static const std::vector<ConfigCase> cases = {
      {"missing field", [](json& j) { j.erase("hidden_size"); }, "config field 'hidden_size' is missing"},
      {"wrong type", [](json& j) { j["num_attention_heads"] = "four"; }, "'num_attention_heads' must be an integer"},
      {"ratios length", [](json& j) { j["compress_ratios"] = {0, 4, 128}; }, "'compress_ratios' has 3 entries"},
      {"ratio value", [](json& j) { j["compress_ratios"][2] = 64; }, "'compress_ratios[2]' must be 0, 4 or 128"},
      {"scoring", [](json& j) { j["scoring_func"] = "relu"; }, "'scoring_func' must be sqrtsoftplus"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 2; }, "'num_key_value_heads' must be 1"},
      {"fp8 format", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }, "'quantization_config.fmt' must be 'e4m3'"},
      {"block", [](json& j) { j["quantization_config"]["weight_block_size"] = {128, 64}; }, "weight_block_size' must be [N, N]"},
      {"yarn", [](json& j) { j["rope_scaling"]["factor"] = 8; }, "'rope_scaling.factor' (8"},
      {"o_groups", [](json& j) { j["o_groups"] = 3; }, "'o_groups' must divide num_attention_heads"},
      {"experts", [](json& j) { j["expert_dtype"] = "int4"; }, "'expert_dtype' must be 'fp4' or 'fp8'"},
      {"topk", [](json& j) { j["num_experts_per_tok"] = 9; }, "'num_experts_per_tok' exceeds n_routed_experts"},
      {"model type", [](json& j) { j["model_type"] = "deepseek_v3"; }, "'model_type' must be 'deepseek_v4'"},
      {"hash layers", [](json& j) { j["num_hash_layers"] = 9; }, "'num_hash_layers' must be in [0, num_hidden_layers]"},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, "'hidden_act' must be 'silu'"},
      {"group routing", [](json& j) { j["n_group"] = 8; }, "'n_group' group-limited routing"},
  };
  return cases;
}

TEST_P(BadConfig, ErrorNamesTheField) {
  const ConfigCase& c = config_cases()[GetParam()];
  json j = json::parse(default_model_config_json());
  c.edit(j);
  try {
    parse_config(j.dump(), "some/config.json");
    FAIL() << c.what << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("some/config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BadConfig, ::testing::Range(0, 16));

TEST(Config, InvalidJsonNamesTheFile) {
  EXPECT_THROW(parse_config("{\"hidden_size\": ", "x/config.json"), Error);
}

// transformers' spelling of the same configuration parses to the same values.
TEST(Config, TransformersSpellingEqualsOfficial) {
  json off = json::parse(default_model_config_json());
  ModelConfig a = parse_config(off.dump(), "official");
  json hf = off;
  hf.erase("compress_ratios");
  hf.erase("num_hash_layers");
  hf.erase("qk_rope_head_dim");
  hf.erase("rope_scaling");
  hf["layer_types"] = {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                       "compressed_sparse_attention"};
  hf["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe"};
  hf["partial_rotary_factor"] = 0.5;
  hf["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 10000}}},
                           {"compress", {{"rope_type", "yarn"}, {"rope_theta", 160000}, {"factor", 16},
                                         {"original_max_position_embeddings", 65536}, {"beta_fast", 32},
                                         {"beta_slow", 1}}}};
  ModelConfig b = parse_config(hf.dump(), "hf");
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.num_hash_layers, b.num_hash_layers);
  EXPECT_EQ(a.rope_head_dim, b.rope_head_dim);
  EXPECT_EQ(a.yarn.factor, b.yarn.factor);
  EXPECT_EQ(a.yarn.original_max_position_embeddings, b.yarn.original_max_position_embeddings);
  EXPECT_EQ(a.compress_rope_theta, b.compress_rope_theta);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
}

TEST(Config, OfficialFlashAndProValuesParse) {
  json j = json::parse(default_model_config_json());
  j["hidden_size"] = 4096;
  j["num_hidden_layers"] = 43;
  j["num_attention_heads"] = 64;
  j["head_dim"] = 512;
  j["q_lora_rank"] = 1024;
  j["o_groups"] = 8;
  j["o_lora_rank"] = 1024;
  j["n_routed_experts"] = 256;
  j["num_experts_per_tok"] = 6;
  j["moe_intermediate_size"] = 2048;
  j["num_hash_layers"] = 3;
  j["index_n_heads"] = 64;
  j["index_topk"] = 512;
  j["sliding_window"] = 128;
  std::vector<int> r = {0, 0};
  for (int i = 0; i < 20; ++i) r.push_back(4), r.push_back(128);
  r.push_back(4);
  r.push_back(0);
  j["compress_ratios"] = r;
  ModelConfig c = parse_config(j.dump(), "flash");
  EXPECT_EQ(c.num_layers_total(), 44);
  EXPECT_EQ(c.attn_kind(2), AttnKind::kCSA);
  EXPECT_EQ(c.attn_kind(3), AttnKind::kHCA);
  EXPECT_EQ(c.attn_kind(43), AttnKind::kWindow);  // the MTP layer
  // Spot checks against the official V4-Flash index (spec section 3): hash tables on layers 0-2, the
  // indexer on CSA layers only, the 128-row compressor on HCA layers, the MTP extras on mtp.0.
  std::map<std::string, Shape> by_name;
  for (const auto& e : expected_tensors(c)) by_name[e.name] = e.shape;
  EXPECT_EQ(by_name.at("layers.2.ffn.gate.tid2eid"), (Shape{129280, 6}));
  EXPECT_EQ(by_name.count("layers.3.ffn.gate.tid2eid"), 0u);
  EXPECT_EQ(by_name.at("layers.3.ffn.gate.bias"), (Shape{256}));
  EXPECT_EQ(by_name.at("layers.2.attn.indexer.wq_b.weight"), (Shape{8192, 1024}));
  EXPECT_EQ(by_name.at("layers.2.attn.indexer.wq_b.scale"), (Shape{64, 8}));
  EXPECT_EQ(by_name.count("layers.3.attn.indexer.wq_b.weight"), 0u);
  EXPECT_EQ(by_name.at("layers.3.attn.compressor.ape"), (Shape{128, 512}));
  EXPECT_EQ(by_name.at("layers.2.attn.compressor.wkv.weight"), (Shape{1024, 4096}));
  EXPECT_EQ(by_name.at("layers.5.attn.wo_a.weight"), (Shape{8192, 4096}));
  EXPECT_EQ(by_name.at("layers.5.ffn.experts.255.w2.weight"), (Shape{4096, 1024}));
  EXPECT_EQ(by_name.at("layers.5.ffn.experts.255.w2.scale"), (Shape{4096, 64}));
  EXPECT_EQ(by_name.at("mtp.0.e_proj.scale"), (Shape{32, 32}));
  EXPECT_EQ(by_name.count("layers.0.attn.compressor.wkv.weight"), 0u);
}

}  // namespace
}  // namespace dsv4
