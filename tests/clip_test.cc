// CLIP text encoder: configuration, layout detection, the forward pass against the sd15-tiny / flux-tiny
// goldens through every checkpoint layout, clip skip, pooling, weight errors and A1111 emphasis.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "io/safetensors.h"
#include "models/clip/clip_text_model.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kGoldenTol = 1e-5;       // rel L2 for a float32 component (fixtures README)
constexpr double kSameMathTol = 1e-6;     // two layouts of the same weights: rounding only
constexpr int kTinyHeads = 4;             // sd15-tiny / flux-tiny: hidden 32 / 24, not a multiple of 64
constexpr int32_t kBos = 49406, kEos = 49407;

// "blurry, low quality" (the fixture's negative prompt): every word is one CLIP BPE token
// (vocab.json: blurry</w> 21977, ,</w> 267, low</w> 1042, quality</w> 3027), padded with EOS to 77.
Tensor negative_prompt_ids() {
  std::vector<int32_t> ids = {kBos, 21977, 267, 1042, 3027};
  ids.resize(77, kEos);
  Tensor t = Tensor::empty({1, 77}, DType::I32);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

Tensor ids_tensor(const std::vector<int32_t>& ids, int64_t batch = 1) {
  Tensor t = Tensor::empty({batch, int64_t(ids.size()) / batch}, DType::I32);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

Tensor golden_ids(const std::string& fixture, const std::string& key) {
  // golden() converts to f32; token ids < 2^24 survive exactly.
  const std::vector<float> v = test::golden(fixture, key).to_vector();
  std::vector<int32_t> ids(v.begin(), v.end());
  return ids_tensor(ids);
}

std::string unique_temp(const std::string& stem) {
  static std::atomic<int> counter{0};
  return (fs::temp_directory_path() /
          ("atelier_clip_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + stem + ".safetensors"))
      .string();
}

// Deletes the file when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& stem) : path(unique_temp(stem)) {}
  ~TempFile() { std::error_code ec; fs::remove(path, ec); }
};

WeightStore open_store(const std::vector<std::string>& files) {
  auto s = WeightStore::open(files);
  EXPECT_TRUE(s.has_value()) << s.status().message();
  return std::move(s).value();
}

ClipTextModel load_model(const WeightStore& store, ClipLayout layout, const ClipTextConfig& cfg,
                         std::optional<int> default_skip = std::nullopt) {
  auto m = ClipTextModel::load(store, layout, cfg, Device::cpu(), DType::F32, default_skip);
  EXPECT_TRUE(m.has_value()) << m.status().message();
  return std::move(m).value();
}

// Every tensor of the HF text encoder with "text_model." stripped: the tower's canonical names.
std::vector<std::pair<std::string, Tensor>> hf_tensors(const WeightStore& store) {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string tower = "text_model.";
  for (const auto& key : store.keys_with_prefix(tower)) out.push_back({key.substr(tower.size()), store.read(key).value()});
  return out;
}

struct SdTiny {
  fs::path dir;
  fs::path folder_weights() const { return dir / "model/text_encoder/model.safetensors"; }
  fs::path single_file() const { return dir / "sd15-tiny.safetensors"; }
  ClipTextConfig config() const { return ClipTextConfig::from_file((dir / "model/text_encoder/config.json").string()).value(); }
};

void expect_matches_golden(const Expected<Tensor>& out, const std::string& key, const std::string& what) {
  ASSERT_TRUE(out.has_value()) << what << ": " << out.status().message();
  const Tensor want = test::golden("sd15-tiny", key);
  ASSERT_EQ(out->shape(), want.shape()) << what;
  const double rel = test::rel_l2(out->to_vector(), want.to_vector());
  std::cout << "[ figures  ] " << what << " vs " << key << ": rel L2 " << rel << ", max abs "
            << test::max_abs_diff(out->to_vector(), want.to_vector()) << "\n";
  EXPECT_LE(rel, kGoldenTol) << what << " vs " << key;
}

// The four sd15-tiny text goldens through one loaded model.
void check_sd15_goldens(const ClipTextModel& model, const std::string& what) {
  const Tensor cond = golden_ids("sd15-tiny", "tokens.0");
  const Tensor uncond = negative_prompt_ids();
  expect_matches_golden(model.forward(cond), "text.cond", what);
  expect_matches_golden(model.forward(uncond), "text.uncond", what);
  expect_matches_golden(model.forward(cond, 2), "text.cond.clip_skip2", what);
  expect_matches_golden(model.forward(uncond, 2), "text.uncond.clip_skip2", what);
}

// --- configuration -----------------------------------------------------------------------------------

TEST(ClipTextConfig, ReadsTransformersConfigJson) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto c = ClipTextConfig::from_file((dir / "model/text_encoder/config.json").string());
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->intermediate_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->max_position_embeddings, 77);
  EXPECT_EQ(c->vocab_size, 49408);
  EXPECT_EQ(c->hidden_act, UnaryOp::kQuickGelu);
  EXPECT_EQ(c->eos_token_id, 49407);
  EXPECT_EQ(c->projection_dim, 512);
  EXPECT_FLOAT_EQ(c->layer_norm_eps, 1e-5f);
}

TEST(ClipTextConfig, JsonVariantsAndErrors) {
  // A CLIPConfig nests the text settings; OpenCLIP-H converted to transformers uses gelu.
  auto c = ClipTextConfig::from_json(nlohmann::json{{"text_config", {{"hidden_size", 1024}, {"num_attention_heads", 16},
                                                                     {"hidden_act", "gelu"}, {"eos_token_id", 2}}}});
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->hidden_act, UnaryOp::kGelu);
  EXPECT_EQ(c->eos_token_id, 2);
  auto bad_act = ClipTextConfig::from_json(nlohmann::json{{"hidden_act", "swish"}});
  ASSERT_FALSE(bad_act.has_value());
  EXPECT_NE(bad_act.status().message().find("swish"), std::string::npos);
  auto bad_heads = ClipTextConfig::from_json(nlohmann::json{{"hidden_size", 30}, {"num_attention_heads", 4}});
  ASSERT_FALSE(bad_heads.has_value());
  EXPECT_NE(bad_heads.status().message().find("num_attention_heads"), std::string::npos);
  EXPECT_FALSE(ClipTextConfig::from_json(nlohmann::json{{"hidden_size", "big"}}).has_value());
  EXPECT_FALSE(ClipTextConfig::from_file("/nonexistent/config.json").has_value());
}

TEST(ClipTextConfig, DetectsFromShapesInBothFiles) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore folder = open_store({f.folder_weights().string()});
  const WeightStore single = open_store({f.single_file().string()});
  for (const auto& [store, prefix] : {std::pair{&folder, std::string("text_model.")},
                                      std::pair{&single, std::string("cond_stage_model.transformer.text_model.")}}) {
    auto c = ClipTextConfig::detect(*store, prefix, kTinyHeads);
    ASSERT_TRUE(c.has_value()) << c.status().message();
    EXPECT_EQ(c->hidden_size, 32);
    EXPECT_EQ(c->intermediate_size, 64);
    EXPECT_EQ(c->num_hidden_layers, 3);
    EXPECT_EQ(c->num_attention_heads, kTinyHeads);
    EXPECT_EQ(c->vocab_size, 49408);
    EXPECT_EQ(c->max_position_embeddings, 77);
    EXPECT_EQ(c->hidden_act, UnaryOp::kQuickGelu);
    EXPECT_EQ(c->eos_token_id, 2);  // argmax pooling, as SD 1.x's published config
  }
  // 32 is not a multiple of 64: without a fallback the head count cannot be guessed.
  auto no_heads = ClipTextConfig::detect(folder, "text_model.");
  ASSERT_FALSE(no_heads.has_value());
  EXPECT_NE(no_heads.status().message().find("head count"), std::string::npos);
  EXPECT_FALSE(ClipTextConfig::detect(folder, "nothing.here.", kTinyHeads).has_value());
}

TEST(ClipTextConfig, DetectsHeadsFromHiddenSize) {
  // CLIP-L (768 -> 12 heads) and OpenCLIP-H (1024 -> 16): detect reads only shapes, so a file holding just
  // the tensors it inspects (zeros, with the real sizes where they matter) stands in for the checkpoint.
  for (const auto& [hidden, heads, openclip] : {std::tuple{768, 12, false}, std::tuple{1024, 16, true}}) {
    TempFile tmp("heads");
    std::vector<std::pair<std::string, Tensor>> t;
    const std::string p = openclip ? "cond_stage_model.model." : "text_model.";
    const int64_t v = 10, pos = 77, inter = 4 * hidden;
    if (openclip) {
      t.push_back({p + "token_embedding.weight", Tensor::zeros({v, hidden})});
      t.push_back({p + "positional_embedding", Tensor::zeros({pos, hidden})});
      t.push_back({p + "transformer.resblocks.0.mlp.c_fc.weight", Tensor::zeros({inter, 1})});
      t.push_back({p + "transformer.resblocks.23.ln_1.weight", Tensor::zeros({hidden})});
      t.push_back({p + "text_projection", Tensor::zeros({hidden, 1024})});
    } else {
      t.push_back({p + "embeddings.token_embedding.weight", Tensor::zeros({v, hidden})});
      t.push_back({p + "embeddings.position_embedding.weight", Tensor::zeros({pos, hidden})});
      t.push_back({p + "encoder.layers.0.mlp.fc1.weight", Tensor::zeros({inter, 1})});
      t.push_back({p + "encoder.layers.11.layer_norm1.weight", Tensor::zeros({hidden})});
    }
    ASSERT_TRUE(write_safetensors(tmp.path, t).is_ok());
    const WeightStore store = open_store({tmp.path});
    auto c = ClipTextConfig::detect(store, p);
    ASSERT_TRUE(c.has_value()) << c.status().message();
    EXPECT_EQ(c->num_attention_heads, heads);
    EXPECT_EQ(c->num_hidden_layers, openclip ? 24 : 12);
    EXPECT_EQ(c->intermediate_size, inter);
    EXPECT_EQ(c->hidden_act, openclip ? UnaryOp::kGelu : UnaryOp::kQuickGelu);
    EXPECT_EQ(c->projection_dim, openclip ? 1024 : hidden);
  }
}

// --- layouts -----------------------------------------------------------------------------------------

TEST(ClipTextLayout, DetectsFolderAndSingleFile) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore folder = open_store({f.folder_weights().string()});
  const WeightStore single = open_store({f.single_file().string()});
  EXPECT_EQ(detect_clip_layout(folder), ClipLayout::kTransformers);
  EXPECT_EQ(clip_tower_prefix(folder, ClipLayout::kTransformers), "text_model.");
  EXPECT_EQ(detect_clip_layout(single), ClipLayout::kCompVis);
  EXPECT_EQ(clip_tower_prefix(single, ClipLayout::kCompVis), "cond_stage_model.transformer.text_model.");
  const WeightStore unet = open_store({(dir / "model/unet/diffusion_pytorch_model.safetensors").string()});
  EXPECT_EQ(detect_clip_layout(unet), std::nullopt);
}

TEST(ClipTextLayout, OpenClipKeyMap) {
  const KeyMap map = clip_key_map(ClipLayout::kOpenClip);
  EXPECT_EQ(map("embeddings.token_embedding.weight"), "token_embedding.weight");
  EXPECT_EQ(map("embeddings.position_embedding.weight"), "positional_embedding");
  EXPECT_EQ(map("encoder.layers.7.layer_norm1.bias"), "transformer.resblocks.7.ln_1.bias");
  EXPECT_EQ(map("encoder.layers.7.layer_norm2.weight"), "transformer.resblocks.7.ln_2.weight");
  EXPECT_EQ(map("encoder.layers.12.self_attn.in_proj_weight"), "transformer.resblocks.12.attn.in_proj_weight");
  EXPECT_EQ(map("encoder.layers.12.self_attn.out_proj.bias"), "transformer.resblocks.12.attn.out_proj.bias");
  EXPECT_EQ(map("encoder.layers.0.mlp.fc1.weight"), "transformer.resblocks.0.mlp.c_fc.weight");
  EXPECT_EQ(map("encoder.layers.0.mlp.fc2.bias"), "transformer.resblocks.0.mlp.c_proj.bias");
  EXPECT_EQ(map("final_layer_norm.weight"), "ln_final.weight");
  EXPECT_FALSE(bool(clip_key_map(ClipLayout::kCompVis)));
}

// --- forward vs goldens ------------------------------------------------------------------------------

TEST(ClipText, DiffusersFolderMatchesGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  check_sd15_goldens(load_model(store, ClipLayout::kTransformers, f.config()), "diffusers folder");
}

TEST(ClipText, CompVisSingleFileMatchesGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.single_file().string()});
  // No config in a single file: everything comes from the shapes.
  auto cfg = ClipTextConfig::detect(store, clip_tower_prefix(store, ClipLayout::kCompVis), kTinyHeads);
  ASSERT_TRUE(cfg.has_value()) << cfg.status().message();
  const ClipTextModel model = load_model(store, ClipLayout::kCompVis, *cfg);
  EXPECT_EQ(model.default_skip(), 1);
  EXPECT_FALSE(model.has_projection());
  check_sd15_goldens(model, "CompVis single file");
}

TEST(ClipText, TransformersFiveLayoutWithoutPrefix) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore src = open_store({f.folder_weights().string()});
  TempFile tmp("noprefix");
  ASSERT_TRUE(write_safetensors(tmp.path, hf_tensors(src)).is_ok());
  const WeightStore store = open_store({tmp.path});
  EXPECT_EQ(detect_clip_layout(store), ClipLayout::kTransformers);
  EXPECT_EQ(clip_tower_prefix(store, ClipLayout::kTransformers), "");
  check_sd15_goldens(load_model(store, ClipLayout::kTransformers, f.config()), "transformers 5 (no prefix)");
}

TEST(ClipText, BatchOfTwoMatchesEachPrompt) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  const ClipTextModel model = load_model(store, ClipLayout::kTransformers, f.config());
  // [uncond, cond] in one batch, as CFG runs it; i64 ids as well.
  std::vector<float> a = negative_prompt_ids().to_vector(), b = golden_ids("sd15-tiny", "tokens.0").to_vector();
  Tensor ids = Tensor::empty({2, 77}, DType::I64);
  for (int i = 0; i < 77; ++i) ids.data<int64_t>()[i] = int64_t(a[size_t(i)]), ids.data<int64_t>()[77 + i] = int64_t(b[size_t(i)]);
  auto out = model.forward(ids);
  ASSERT_TRUE(out.has_value()) << out.status().message();
  ASSERT_EQ(out->shape(), (Shape{2, 77, 32}));
  EXPECT_REL_L2_LE(out->select(0, 0).to_vector(), test::golden("sd15-tiny", "text.uncond").to_vector(), kGoldenTol);
  EXPECT_REL_L2_LE(out->select(0, 1).to_vector(), test::golden("sd15-tiny", "text.cond").to_vector(), kGoldenTol);
}

// A sequence shorter than the model's positions takes the top-left corner of the causal mask made at load
// time: with a causal mask, each position of a prefix sees what it sees in the whole sequence.
TEST(ClipText, ShortSequencesSeeTheirPrefixAsInTheWholeSequence) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  const ClipTextModel model = load_model(store, ClipLayout::kTransformers, f.config());
  const Tensor ids = golden_ids("sd15-tiny", "tokens.0");
  auto whole = model.forward(ids);
  ASSERT_TRUE(whole.has_value()) << whole.status().message();
  for (int64_t len : {1, 5, 40}) {
    auto prefix = model.forward(ops::contiguous(ids.narrow(1, 0, len)));
    ASSERT_TRUE(prefix.has_value()) << prefix.status().message();
    ASSERT_EQ(prefix->shape(), (Shape{1, len, 32}));
    SCOPED_TRACE(std::to_string(len) + " tokens");
    EXPECT_REL_L2_LE(prefix->to_vector(), ops::contiguous(whole->narrow(1, 0, len)).to_vector(), 1e-5);
  }
}

TEST(ClipText, RejectsBadInputs) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  const ClipTextModel model = load_model(store, ClipLayout::kTransformers, f.config());
  const Tensor ids = golden_ids("sd15-tiny", "tokens.0");
  EXPECT_FALSE(model.forward(ids, 0).has_value());
  EXPECT_EQ(model.max_clip_skip(), 4);
  EXPECT_TRUE(model.forward(ids, 4).has_value());  // the embeddings, then the final norm
  EXPECT_FALSE(model.forward(ids, 5).has_value());
  // clip_skip k runs the first N - (k - 1) layers: skip 3 of 3 layers = a one-layer model's output.
  ClipTextConfig one_layer = f.config();
  one_layer.num_hidden_layers = 1;
  const ClipTextModel shallow = load_model(store, ClipLayout::kTransformers, one_layer);
  EXPECT_EQ(model.forward(ids, 3)->to_vector(), shallow.forward(ids, 1)->to_vector());
  EXPECT_FALSE(model.forward(Tensor::zeros({1, 77}), 1).has_value());                   // f32 ids
  EXPECT_FALSE(model.forward(ids_tensor(std::vector<int32_t>(78, kEos)), 1).has_value());  // 78 > 77 positions
  auto oov = model.forward(ids_tensor({kBos, 49408, kEos}));
  ASSERT_FALSE(oov.has_value());
  EXPECT_NE(oov.status().message().find("49408"), std::string::npos);
}

// --- pooled output -----------------------------------------------------------------------------------

TEST(ClipText, PooledOutputMatchesFluxGolden) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const WeightStore store = open_store({(dir / "model/text_encoder/model.safetensors").string()});
  auto cfg = ClipTextConfig::from_file((dir / "model/text_encoder/config.json").string());
  ASSERT_TRUE(cfg.has_value()) << cfg.status().message();
  const ClipTextModel model = load_model(store, ClipLayout::kTransformers, *cfg);
  auto out = model.forward_with_pooled(golden_ids("flux-tiny", "clip.tokens.0"));
  ASSERT_TRUE(out.has_value()) << out.status().message();
  const Tensor want = test::golden("flux-tiny", "text.clip_pooled");
  ASSERT_EQ(out->pooled.shape(), want.shape());
  const double rel = test::rel_l2(out->pooled.to_vector(), want.to_vector());
  std::cout << "[ figures  ] flux-tiny pooled vs text.clip_pooled: rel L2 " << rel << "\n";
  EXPECT_LE(rel, kGoldenTol);
}

TEST(ClipText, PoolingPositionFollowsTransformers) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  ClipTextConfig cfg = f.config();
  // No EOS in the sequence: the legacy rule (eos 2) takes argmax(ids) = position 1; the eos rule takes the
  // first position equal to eos_token_id (1125: 2, not 4), and with none there torch's argmax of all-false: 0.
  const Tensor ids = ids_tensor({320, 40000, 1125, 539, 1125});
  for (const auto& [eos, position] : {std::pair{int64_t(2), 1}, std::pair{int64_t(kEos), 0}, std::pair{int64_t(1125), 2}}) {
    cfg.eos_token_id = eos;
    const ClipTextModel model = load_model(store, ClipLayout::kTransformers, cfg);
    auto out = model.forward_with_pooled(ids);
    ASSERT_TRUE(out.has_value()) << out.status().message();
    EXPECT_EQ(out->pooled.to_vector(), out->hidden.select(0, 0).select(0, position).to_vector()) << "eos " << eos;
  }
  // Ties: EOS padding repeats the highest id; argmax takes the first (the prompt's own EOS at 11).
  cfg.eos_token_id = 2;
  const ClipTextModel legacy = load_model(store, ClipLayout::kTransformers, cfg);
  auto padded = legacy.forward_with_pooled(golden_ids("sd15-tiny", "tokens.0"));
  ASSERT_TRUE(padded.has_value()) << padded.status().message();
  EXPECT_EQ(padded->pooled.to_vector(), padded->hidden.select(0, 0).select(0, 11).to_vector());
}

TEST(ClipText, PooledOptionsHiddenSkipAndRawState) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore store = open_store({f.folder_weights().string()});
  const ClipTextModel model = load_model(store, ClipLayout::kTransformers, f.config());
  const Tensor ids = golden_ids("sd15-tiny", "tokens.0");
  auto full = model.forward_with_pooled(ids);
  auto skip2 = model.forward_with_pooled(ids, {.clip_skip = 2});
  auto raw = model.forward_with_pooled(ids, {.clip_skip = 2, .hidden_final_norm = false});
  ASSERT_TRUE(full.has_value() && skip2.has_value() && raw.has_value());
  EXPECT_REL_L2_LE(skip2->hidden.to_vector(), test::golden("sd15-tiny", "text.cond.clip_skip2").to_vector(), kGoldenTol);
  // The pooled state always comes from the last layer, whatever the clip skip.
  EXPECT_EQ(skip2->pooled.to_vector(), full->pooled.to_vector());
  // Without the final norm the penultimate state is not normalised: it differs from the golden a lot.
  EXPECT_GT(test::rel_l2(raw->hidden.to_vector(), skip2->hidden.to_vector()), 0.1);
}

// --- weight errors -----------------------------------------------------------------------------------

TEST(ClipText, MissingAndMisshapedTensorsAreListed) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore src = open_store({f.folder_weights().string()});
  std::vector<std::pair<std::string, Tensor>> t;
  for (auto& [k, v] : hf_tensors(src)) {
    if (k == "encoder.layers.1.mlp.fc2.bias") continue;                                    // missing
    if (k == "encoder.layers.2.self_attn.k_proj.weight") v = Tensor::zeros({32, 16});      // wrong shape
    t.push_back({"text_model." + k, v});
  }
  TempFile tmp("broken");
  ASSERT_TRUE(write_safetensors(tmp.path, t).is_ok());
  const WeightStore store = open_store({tmp.path});
  auto m = ClipTextModel::load(store, ClipLayout::kTransformers, f.config(), Device::cpu());
  ASSERT_FALSE(m.has_value());
  const std::string& msg = m.status().message();
  std::cout << "[ message  ] " << msg << "\n";
  EXPECT_NE(msg.find("text_model.encoder.layers.1.mlp.fc2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_model.encoder.layers.2.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 16]"), std::string::npos) << msg;
  // A config asking for more layers than the file has names the first absent layer's keys.
  ClipTextConfig deeper = f.config();
  deeper.num_hidden_layers = 4;
  auto d = ClipTextModel::load(src, ClipLayout::kTransformers, deeper, Device::cpu());
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.status().message().find("text_model.encoder.layers.3.self_attn.q_proj.weight"), std::string::npos);
  // The CPU computes in f32.
  EXPECT_FALSE(ClipTextModel::load(src, ClipLayout::kTransformers, f.config(), Device::cpu(), DType::F16).has_value());
}

// --- OpenCLIP layout ---------------------------------------------------------------------------------

// The sd15-tiny text encoder rewritten as an SD 2.x single file would hold it (OpenCLIP names, q/k/v fused
// into in_proj), plus a text projection [D, proj]; `hf_projection` receives the same projection as a
// transformers Linear weight [proj, D].
std::vector<std::pair<std::string, Tensor>> openclip_tensors(const WeightStore& hf, int64_t proj_dim, Tensor& hf_projection) {
  const std::string p = "cond_stage_model.model.";
  const KeyMap map = clip_key_map(ClipLayout::kOpenClip);
  std::vector<std::pair<std::string, Tensor>> out;
  auto read = [&](const std::string& k) { return hf.read("text_model." + k).value(); };
  for (auto& [k, v] : hf_tensors(hf)) {
    if (k.find("self_attn.q_proj") != std::string::npos || k.find("self_attn.k_proj") != std::string::npos ||
        k.find("self_attn.v_proj") != std::string::npos)
      continue;
    out.push_back({p + map(k), v});
  }
  for (int i = 0; i < 3; ++i) {
    const std::string l = "encoder.layers." + std::to_string(i) + ".self_attn.";
    for (const std::string part : {"weight", "bias"}) {
      Tensor fused = ops::concat({read(l + "q_proj." + part), read(l + "k_proj." + part), read(l + "v_proj." + part)}, 0);
      out.push_back({p + map(l + "in_proj_" + part), fused});
    }
  }
  std::vector<float> values(size_t(32 * proj_dim));
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * float(i)) * 0.2f;
  Tensor openclip_proj = Tensor::from_vector(values, {32, proj_dim});
  hf_projection = ops::contiguous(openclip_proj.transpose(0, 1));
  out.push_back({p + "text_projection", openclip_proj});
  out.push_back({p + "logit_scale", Tensor::full({1}, 4.6f)});  // present in real files; not used
  return out;
}

TEST(ClipText, OpenClipLayoutMatchesTransformersLayout) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore hf = open_store({f.folder_weights().string()});
  constexpr int64_t kProj = 8;
  Tensor hf_proj;
  TempFile oc_file("openclip"), hf_file("hfproj");
  ASSERT_TRUE(write_safetensors(oc_file.path, openclip_tensors(hf, kProj, hf_proj)).is_ok());
  // The same weights as a CLIPTextModelWithProjection in transformers' layout.
  auto hf_with_proj = hf_tensors(hf);
  for (auto& [k, v] : hf_with_proj) k = "text_model." + k;
  hf_with_proj.push_back({"text_projection.weight", hf_proj});
  ASSERT_TRUE(write_safetensors(hf_file.path, hf_with_proj).is_ok());
  const WeightStore oc = open_store({oc_file.path});
  const WeightStore hfp = open_store({hf_file.path});
  ASSERT_EQ(detect_clip_layout(oc), ClipLayout::kOpenClip);

  // Shapes say: 3 layers, gelu (OpenCLIP), projection 8.
  auto detected = ClipTextConfig::detect(oc, clip_tower_prefix(oc, ClipLayout::kOpenClip), kTinyHeads);
  ASSERT_TRUE(detected.has_value()) << detected.status().message();
  EXPECT_EQ(detected->num_hidden_layers, 3);
  EXPECT_EQ(detected->hidden_act, UnaryOp::kGelu);
  EXPECT_EQ(detected->projection_dim, kProj);

  // Same activation and layer count as the transformers model: same numbers, every clip skip.
  ClipTextConfig cfg = f.config();
  cfg.projection_dim = kProj;
  const ClipTextModel a = load_model(hfp, ClipLayout::kTransformers, cfg);
  const ClipTextModel b = load_model(oc, ClipLayout::kOpenClip, cfg, /*default_skip=*/1);
  ASSERT_TRUE(a.has_projection() && b.has_projection());
  const Tensor ids = golden_ids("sd15-tiny", "tokens.0");
  for (int skip : {1, 2, 3}) {
    auto x = a.forward_with_pooled(ids, {.clip_skip = skip});
    auto y = b.forward_with_pooled(ids, {.clip_skip = skip});
    ASSERT_TRUE(x.has_value() && y.has_value());
    EXPECT_REL_L2_LE(y->hidden.to_vector(), x->hidden.to_vector(), kSameMathTol);
    EXPECT_REL_L2_LE(y->pooled.to_vector(), x->pooled.to_vector(), kSameMathTol);
    ASSERT_EQ(y->pooled.shape(), (Shape{1, kProj}));
  }
  expect_matches_golden(b.forward(ids), "text.cond", "OpenCLIP layout");

  // SD 2.x default: penultimate layer. clip_skip 1 on the single file = the converted (one layer fewer) model.
  const ClipTextModel sd2 = load_model(oc, ClipLayout::kOpenClip, cfg);
  EXPECT_EQ(sd2.default_skip(), 2);
  EXPECT_EQ(sd2.max_clip_skip(), 3);
  expect_matches_golden(sd2.forward(ids), "text.cond.clip_skip2", "OpenCLIP default skip");
  ClipTextConfig converted = cfg;
  converted.num_hidden_layers = 2;
  const ClipTextModel conv = load_model(hfp, ClipLayout::kTransformers, converted);
  auto s = sd2.forward_with_pooled(ids), c = conv.forward_with_pooled(ids);
  ASSERT_TRUE(s.has_value() && c.has_value());
  EXPECT_REL_L2_LE(s->hidden.to_vector(), c->hidden.to_vector(), kSameMathTol);
  EXPECT_REL_L2_LE(s->pooled.to_vector(), c->pooled.to_vector(), kSameMathTol);
  auto s2 = sd2.forward(ids, 2), c2 = conv.forward(ids, 2);
  ASSERT_TRUE(s2.has_value() && c2.has_value());
  EXPECT_REL_L2_LE(s2->to_vector(), c2->to_vector(), kSameMathTol);

  // The detected (gelu) model differs from the quick_gelu one: the activation is really used.
  const ClipTextModel g = load_model(oc, ClipLayout::kOpenClip, *detected, 1);
  EXPECT_GT(test::rel_l2(g.forward(ids)->to_vector(), a.forward(ids)->to_vector()), 1e-4);
}

TEST(ClipText, OpenClipMissingFusedProjectionIsListed) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const SdTiny f{dir};
  const WeightStore hf = open_store({f.folder_weights().string()});
  Tensor unused;
  auto t = openclip_tensors(hf, 8, unused);
  std::erase_if(t, [](const auto& kv) { return kv.first == "cond_stage_model.model.transformer.resblocks.1.attn.in_proj_weight"; });
  TempFile tmp("oc_missing");
  ASSERT_TRUE(write_safetensors(tmp.path, t).is_ok());
  const WeightStore store = open_store({tmp.path});
  ClipTextConfig cfg = f.config();
  cfg.projection_dim = 8;
  auto m = ClipTextModel::load(store, ClipLayout::kOpenClip, cfg, Device::cpu());
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.status().message().find("cond_stage_model.model.transformer.resblocks.1.attn.in_proj_weight"), std::string::npos)
      << m.status().message();
}

// --- emphasis ----------------------------------------------------------------------------------------

TEST(ClipTextEmphasis, ScalesTokensAndRestoresTheMean) {
  constexpr int64_t kB = 2, kS = 5, kD = 3;
  std::vector<float> z(size_t(kB * kS * kD)), w(size_t(kB * kS));
  for (size_t i = 0; i < z.size(); ++i) z[i] = 0.5f + std::cos(0.7f * float(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = (i % 3 == 1) ? 1.2f : (i % 3 == 2 ? 0.8f : 1.0f);
  auto out = apply_emphasis(Tensor::from_vector(z, {kB, kS, kD}), Tensor::from_vector(w, {kB, kS}));
  ASSERT_TRUE(out.has_value()) << out.status().message();
  const std::vector<float> o = out->to_vector();
  // Reference: A1111's z * w, then z * (old mean / new mean), in double.
  double before = 0, after = 0;
  for (size_t i = 0; i < z.size(); ++i) before += z[i], after += double(z[i]) * w[i / kD];
  double got_mean = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double want = double(z[i]) * w[i / kD] * (before / after);
    EXPECT_NEAR(o[i], want, 1e-6 * std::max(1.0, std::abs(want))) << i;
    got_mean += o[i];
  }
  EXPECT_NEAR(got_mean / double(o.size()), before / double(z.size()), 1e-6);
  EXPECT_GT(std::abs(before / after - 1.0), 1e-3);  // the rescale did something
}

TEST(ClipTextEmphasis, UnitWeightsAreIdentityAndShapesChecked) {
  std::vector<float> z = {1, -2, 3, 0.5f, 4, -1};
  auto out = apply_emphasis(Tensor::from_vector(z, {1, 2, 3}), Tensor::full({1, 2}, 1.0f));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->to_vector(), z);
  EXPECT_FALSE(apply_emphasis(Tensor::from_vector(z, {1, 2, 3}), Tensor::full({1, 3}, 1.0f)).has_value());
  EXPECT_FALSE(apply_emphasis(Tensor::from_vector(z, {2, 3}), Tensor::full({2, 3}, 1.0f)).has_value());
}

}  // namespace
}  // namespace atelier
