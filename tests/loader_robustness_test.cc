// Malformed model files give errors, never crashes (each case below crashed a loader before: a stack overflow in
// nlohmann's recursive dump or copy of a deeply nested value, an index into an empty array, a division by a zero
// dimension, an exception thrown past every catch): found by fuzzing `atelier generate --model` with mutated copies
// of the tiny fixtures.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "io/json_util.h"
#include "io/safetensors.h"
#include "models/common/weights.h"
#include "models/flux/flux_config.h"
#include "models/qwen3/qwen3_encoder.h"
#include "models/sd/unet_config.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/vae_config.h"
#include "pipeline/flux_model.h"
#include "sampling/flow_match.h"
#include "sampling/scheduler_config.h"
#include "tokenizers/clip_tokenizer.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

// A scratch folder removed when the test ends.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("atelier_loader_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
};

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

// A safetensors file: the 8-byte little-endian header length, the header, `data` bytes.
std::string safetensors_bytes(const std::string& header, size_t data = 0) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + std::string(data, '\0');
}

TEST(LoaderRobustness, DeeplyNestedJsonIsAnError) {
  bool too_deep = false;
  EXPECT_TRUE(parse_json_bounded(nested(100000), &too_deep).is_discarded());
  EXPECT_TRUE(too_deep);
  EXPECT_FALSE(parse_json_bounded(nested(kMaxJsonDepth), &too_deep).is_discarded());
  EXPECT_FALSE(too_deep);
  const auto parsed = parse_json("{\"a\": " + nested(100000) + "}", "config.json");
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.status().message().find("nests deeper than"), std::string::npos) << parsed.status().message();

  ScratchDir dir;
  const auto unet = load_unet_config(dir.write("unet/config.json", "{\"zzz\": " + nested(100000) + "}"));
  ASSERT_FALSE(unet);
  EXPECT_NE(unet.status().message().find("nests deeper than"), std::string::npos) << unet.status().message();
  // The scheduler config's Python floats are restored by a recursive walk: the depth is refused before it.
  const auto sched = sampling::parse_config_json("{\"zzz\": " + nested(100000) + "}");
  ASSERT_FALSE(sched);
  EXPECT_NE(sched.status().message().find("nests deeper than"), std::string::npos) << sched.status().message();
}

TEST(LoaderRobustness, SafetensorsHeaderNestedPastATensorEntryIsAnError) {
  ScratchDir dir;
  for (const std::string& header :
       {"{\"t\":{\"dtype\":\"F16\",\"data_offsets\":[0,2],\"shape\":[" + nested(100000) + "]}}",
        "{\"__metadata__\":{\"a\":" + nested(1000000) + "},\"t\":{\"dtype\":\"F16\",\"data_offsets\":[0,2],\"shape\":[1]}}"}) {
    const std::string path = dir.write("deep.safetensors", safetensors_bytes(header, 2));
    auto store = WeightStore::open({path});
    ASSERT_FALSE(store);
    EXPECT_NE(store.status().message().find("nests deeper than"), std::string::npos) << store.status().message().substr(0, 300);
    EXPECT_LT(store.status().message().size(), 1000u);
  }
}

TEST(LoaderRobustness, ConfigValuesOfTheWrongShapeAreErrors) {
  ATELIER_REQUIRE_FIXTURE(fixture, "sd15-tiny");
  nlohmann::json config = read_json_file((fixture / "model/unet/config.json").string()).value();
  config["sample_size"] = nlohmann::json::array();
  auto unet = parse_unet_config(config);
  ASSERT_FALSE(unet);
  EXPECT_NE(unet.status().message().find("sample_size"), std::string::npos) << unet.status().message();
  config["sample_size"] = 64;
  config["layers_per_block"] = 1000000;  // built a million layers' missing-tensor errors (gigabytes) before failing
  unet = parse_unet_config(config);
  ASSERT_FALSE(unet);
  EXPECT_NE(unet.status().message().find("more than 256 layers"), std::string::npos) << unet.status().message();
  config["layers_per_block"] = 2;
  // Integers that do not fit, or are not whole, are errors: nlohmann's get<int> read 2^32 + 64 as 64 and 64.5 as 64.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"block_out_channels", {uint64_t(1) << 32 | 32, 64, 64, 64}}, {"layers_per_block", 2.5}, {"sample_size", 64.5}}) {
    nlohmann::json bad = config;
    bad[key] = value;
    unet = parse_unet_config(bad);
    ASSERT_FALSE(unet) << key;
    EXPECT_NE(unet.status().message().find(key + ": expected an integer"), std::string::npos) << unet.status().message();
  }
  nlohmann::json vae = read_json_file((fixture / "model/vae/config.json").string()).value();
  vae["latent_channels"] = (uint64_t(1) << 32) + 4;
  const auto v = VaeConfig::from_json(vae);
  ASSERT_FALSE(v);
  EXPECT_NE(v.status().message().find("latent_channels: expected an integer"), std::string::npos) << v.status().message();
  // Values of the wrong JSON type name their key and what was expected (nlohmann's type_error names neither).
  for (const auto& [key, value, expected] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"act_fn", 5, "act_fn: expected a string"},
           {"use_linear_projection", "yes", "use_linear_projection: expected true or false"},
           {"norm_eps", "x", "norm_eps: expected a number"},
           {"down_block_types", {"CrossAttnDownBlock2D", 5}, "down_block_types: expected a string"},
           {"only_cross_attention", {true, 1, false, false}, "only_cross_attention: expected true or false"},
           {"block_out_channels", "abc", "'block_out_channels' must be a list of ints"}}) {
    nlohmann::json bad = config;
    bad[key] = value;
    unet = parse_unet_config(bad);
    ASSERT_FALSE(unet) << key;
    EXPECT_NE(unet.status().message().find(expected), std::string::npos) << unet.status().message();
  }
  for (const auto& [key, value, expected] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"scaling_factor", "0.18", "scaling_factor: expected a number"},
           {"block_out_channels", 3, "block_out_channels: expected a list"},
           {"act_fn", 5, "act_fn: expected a string"},
           {"_class_name", nlohmann::json::array(), "_class_name: expected a string"},
           {"up_block_types", {"UpDecoderBlock2D", 5, "UpDecoderBlock2D", "UpDecoderBlock2D"}, "up_block_types: expected a string"}}) {
    nlohmann::json bad = read_json_file((fixture / "model/vae/config.json").string()).value();
    bad[key] = value;
    const auto b = VaeConfig::from_json(bad);
    ASSERT_FALSE(b) << key;
    EXPECT_NE(b.status().message().find(expected), std::string::npos) << b.status().message();
  }
  unet = parse_unet_config(nlohmann::json{{"_class_name", 5}});
  ASSERT_FALSE(unet);
  EXPECT_NE(unet.status().message().find("class '5'"), std::string::npos) << unet.status().message();
  // Folder probes read model_index.json before anything checks it: a class name of any type is just not theirs.
  ScratchDir dir;
  for (const char* cls : {"5", "null", "[\"a\"]", "{}"}) {
    dir.write("model/model_index.json", std::string("{\"_class_name\": ") + cls + "}");
    EXPECT_FALSE(is_flux_model((dir.path / "model").string())) << cls;
  }
}

// The DiT models' configs (FLUX transformer, T5, Qwen3) and the flow-match scheduler's: values of the wrong type name
// their key (nlohmann's bare "type must be number, but is string" before, or silently the default), counts that do not
// fit are errors, and schedule values that give no usable sigmas are refused.
TEST(LoaderRobustness, DitAndFlowMatchConfigErrorsNameTheKey) {
  const auto expect_error = [](const Status& st, const std::string& expected) {
    ASSERT_FALSE(st.is_ok()) << expected;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
  };
  using J = nlohmann::json;
  expect_error(FluxConfig::from_json(J{{"num_layers", "2"}}).status(), "num_layers: expected an integer");
  expect_error(FluxConfig::from_json(J{{"guidance_embeds", "yes"}}).status(), "guidance_embeds: expected true or false");
  expect_error(FluxConfig::from_json(J{{"num_layers", (uint64_t(1) << 32) + 2}}).status(), "num_layers: expected an integer");
  expect_error(FluxConfig::from_json(J{{"num_layers", 1000}}).status(), "num_layers + num_single_layers must be");
  expect_error(FluxConfig::from_json(J{{"axes_dims_rope", {1.5, 2, 3}}}).status(), "axes_dims_rope: expected an integer");
  EXPECT_TRUE(FluxConfig::from_json(J{{"out_channels", nullptr}}).has_value());
  expect_error(T5Config::from_json(J{{"d_model", "x"}}).status(), "d_model: expected an integer");
  expect_error(T5Config::from_json(J{{"feed_forward_proj", 5}}).status(), "feed_forward_proj: expected a string");
  expect_error(T5Config::from_json(J{{"num_layers", 100000}}).status(), "num_layers 1..256");
  expect_error(Qwen3Config::from_json(J{{"num_hidden_layers", 1e12}}).status(), "num_hidden_layers must be at most 256");
  expect_error(Qwen3Config::from_json(J{{"rms_norm_eps", -1.0}}).status(), "rms_norm_eps must be a finite number > 0");
  expect_error(sampling::parse_flow_match_config(J{{"shift", "x"}}).status(), "shift: expected a number");
  expect_error(sampling::parse_flow_match_config(J{{"use_dynamic_shifting", "no"}}).status(), "use_dynamic_shifting: expected true or false");
  for (const double shift : {0.0, -1.0})
    expect_error(sampling::parse_flow_match_config(J{{"shift", shift}}).status(), "shift must be a finite number > 0");
  expect_error(sampling::parse_flow_match_config(J{{"shift_terminal", 1.0}}).status(), "shift_terminal must be in [0, 1)");
  expect_error(sampling::parse_flow_match_config(J{{"num_train_timesteps", 2000000000}}).status(), "num_train_timesteps must be");
  // diffusers leaves the terminal stretch off for a falsy shift_terminal (0 or null).
  EXPECT_FALSE(sampling::parse_flow_match_config(J{{"shift_terminal", 0.0}}).value().shift_terminal.has_value());
  EXPECT_TRUE(sampling::parse_flow_match_config(J{{"shift_terminal", 0.02}}).value().shift_terminal.has_value());
}

// A vocabulary id far past the vocabulary's size is refused: the id-to-token table is sized by the largest id.
TEST(LoaderRobustness, VocabularyIdsFarPastTheVocabularyAreAnError) {
  ATELIER_REQUIRE_FIXTURE(fixture, "sd15-tiny");
  ScratchDir dir;
  const fs::path tok = dir.path / "tokenizer";
  fs::create_directories(tok);
  for (const auto& entry : fs::directory_iterator(fixture / "model/tokenizer"))
    if (entry.path().filename() != "tokenizer.json") fs::copy_file(entry.path(), tok / entry.path().filename());
  nlohmann::json vocab = read_json_file((tok / "vocab.json").string()).value();
  vocab["zzzz"] = 100000000;
  std::ofstream(tok / "vocab.json", std::ios::trunc) << vocab.dump();
  const auto t = ClipTokenizer::load(tok.string());
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("token id 100000000 is far past the vocabulary"), std::string::npos) << t.status().message();
}

// Shapes of a file's tensors that configuration detection divides by or indexes: a scalar or a zero dimension is an
// error naming the tensor.
TEST(LoaderRobustness, DetectedShapesOfTheWrongRankAreErrors) {
  ScratchDir dir;
  const auto store_of = [&](const std::vector<std::pair<std::string, Shape>>& tensors) {
    std::vector<std::pair<std::string, Tensor>> t;
    for (const auto& [name, shape] : tensors) t.push_back({name, Tensor::zeros(shape)});
    const std::string path = dir.write("w.safetensors", "");
    EXPECT_TRUE(write_safetensors(path, t).is_ok());
    return WeightStore::open({path}).value();
  };
  // T5: relative attention bias [buckets, 0 heads].
  auto t5 = T5Config::detect(store_of({{"shared.weight", {32, 8}},
                                       {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {32, 0}},
                                       {"encoder.block.0.layer.0.SelfAttention.q.weight", {8, 8}},
                                       {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", {16, 8}}}));
  ASSERT_FALSE(t5);
  EXPECT_NE(t5.status().message().find("relative attention bias"), std::string::npos) << t5.status().message();
  // FLUX (diffusers names): a head dim of 0.
  auto flux = FluxConfig::detect(store_of({{"x_embedder.weight", {32, 64}},
                                           {"context_embedder.weight", {32, 16}},
                                           {"time_text_embed.text_embedder.linear_1.weight", {32, 8}},
                                           {"transformer_blocks.0.attn.norm_q.weight", {0}},
                                           {"proj_out.weight", {64, 32}}}),
                                 FluxLayout::kDiffusers);
  ASSERT_FALSE(flux);
  EXPECT_NE(flux.status().message().find("norm_q"), std::string::npos) << flux.status().message();
  // VAE (diffusers names): an encoder level's convolution weight given as a vector.
  auto vae = detect_vae_config(store_of({{"encoder.conv_in.weight", {8, 3, 3, 3}},
                                         {"decoder.conv_in.weight", {8, 4, 3, 3}},
                                         {"encoder.down_blocks.0.resnets.0.conv1.weight", {8}}}),
                               VaeLayout::kDiffusers);
  ASSERT_FALSE(vae);
  EXPECT_NE(vae.status().message().find("encoder.down_blocks.0.resnets.0.conv1.weight"), std::string::npos)
      << vae.status().message();
}

}  // namespace
}  // namespace atelier
