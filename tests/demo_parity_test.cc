// Parity of the demo model's torch definition (tools/demo_model/model.py) with Atelier's engine: the same
// fp16 weights and inputs must give the same text-encoder, UNet and VAE outputs. Run after a training run:
//   python3 tools/demo_model/parity.py MODEL_DIR OUT.safetensors
//   ATELIER_DEMO_PARITY=OUT.safetensors ATELIER_DEMO_PARITY_MODEL=MODEL_DIR atelier_tests --gtest_filter='DemoParity*'
// Skipped (with the reason printed) when the two variables are not set: it needs a torch run to make its input.
#include <gtest/gtest.h>

#include <cstdlib>

#include "io/safetensors.h"
#include "pipeline/sd_model.h"
#include "test_util.h"

namespace atelier {
namespace {

// fp16 weights, f32 compute on both sides: only summation order differs.
constexpr double kParityTol = 1e-3;

struct ParityCase {
  std::shared_ptr<SdModel> model;
  std::shared_ptr<SafeTensorsFile> file;
  Tensor get(const std::string& key, DType dtype = DType::F32) const {
    auto t = file->load(key, dtype);
    EXPECT_TRUE(t.has_value()) << key << ": " << t.status().message();
    return t.has_value() ? *t : Tensor();
  }
};

// Loads the model and the torch outputs named by the environment; nullopt (test skipped) when unset.
std::optional<ParityCase> load_case() {
  const char* file = std::getenv("ATELIER_DEMO_PARITY");
  const char* dir = std::getenv("ATELIER_DEMO_PARITY_MODEL");
  if (!file || !dir) return std::nullopt;
  auto model = load_sd_model(dir, {});
  EXPECT_TRUE(model.has_value()) << model.status().message();
  auto st = SafeTensorsFile::open(file);
  EXPECT_TRUE(st.has_value()) << st.status().message();
  if (!model.has_value() || !st.has_value()) return std::nullopt;
  return ParityCase{*model, *st};
}

#define DEMO_PARITY_CASE(c)                                                                              \
  auto c##_opt = load_case();                                                                            \
  if (HasFailure()) return;                                                                              \
  if (!c##_opt) GTEST_SKIP() << "set ATELIER_DEMO_PARITY and ATELIER_DEMO_PARITY_MODEL (see the file comment)"; \
  const ParityCase& c = *c##_opt

TEST(DemoParity, TokenizerMatchesTorchIds) {
  DEMO_PARITY_CASE(c);
  const Tensor ids = c.get("ids", DType::I32);
  const auto enc = c.model->tokenizer->encode("two small yellow stars on a purple background");
  ASSERT_EQ(int64_t(enc.size()), ids.shape()[1]);
  for (size_t i = 0; i < enc.size(); ++i) EXPECT_EQ(enc[i], ids.data<int32_t>()[i]) << "position " << i;
}

TEST(DemoParity, TextEncoder) {
  DEMO_PARITY_CASE(c);
  auto out = c.model->text_encoder->forward(c.get("ids", DType::I32));
  ASSERT_TRUE(out.has_value()) << out.status().message();
  EXPECT_REL_L2_LE(out->to_vector(), c.get("context").to_vector(), kParityTol);
}

TEST(DemoParity, UNet) {
  DEMO_PARITY_CASE(c);
  auto out = c.model->unet->forward(c.get("latent"), c.get("timesteps"), c.get("context"));
  ASSERT_TRUE(out.has_value()) << out.status().message();
  EXPECT_REL_L2_LE(out->to_vector(), c.get("eps").to_vector(), kParityTol);
}

TEST(DemoParity, VaeDecodeAndEncode) {
  DEMO_PARITY_CASE(c);
  EXPECT_REL_L2_LE(c.model->vae->decode(c.get("decode_in")).to_vector(), c.get("decoded").to_vector(), kParityTol);
  EXPECT_REL_L2_LE(c.model->vae->encode(c.get("image")).mean.to_vector(), c.get("encoded_mean").to_vector(), kParityTol);
}

}  // namespace
}  // namespace atelier
