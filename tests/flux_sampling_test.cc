// Flow-matching Euler (FlowMatchEulerDiscreteScheduler): the FLUX plan against the fixture run's stored
// sigmas and timesteps, static shift, the default (no sigmas given) path, the Euler step and errors.
#include <cmath>

#include "core/tensor.h"
#include <fstream>
#include "sampling/flow_match.h"
#include "test_util.h"

namespace atelier::sampling {
namespace {

FlowMatchConfig flux_dev_config() {
  FlowMatchConfig c;
  c.shift = 3.0;
  c.use_dynamic_shifting = true;
  return c;
}

TEST(FluxFlowMatch, MuFollowsImageSequenceLength) {
  const FlowMatchConfig c = flux_dev_config();
  EXPECT_DOUBLE_EQ(flow_match_mu(c, 256), 0.5);
  EXPECT_NEAR(flow_match_mu(c, 4096), 1.15, 1e-12);
  EXPECT_NEAR(flow_match_mu(c, 64), 0.5 - 0.65 / 3840 * 192, 1e-12);
}

TEST(FluxFlowMatch, PlanMatchesFixtureRun) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto cfg_json = nlohmann::json::parse(std::ifstream(dir / "model/scheduler/scheduler_config.json"));
  const FlowMatchConfig c = parse_flow_match_config(cfg_json).value();
  EXPECT_TRUE(c.use_dynamic_shifting);
  FlowMatchPlanOptions o;
  o.sigmas = flux_sigmas(4);
  o.mu = flow_match_mu(c, 64);  // 128x128 image: 16x16 latent packed 2x2 = 64 tokens
  const FlowMatchEuler s = FlowMatchEuler::create(c, 4, o).value();
  const auto want_sigmas = test::golden("flux-tiny", "run.flux_euler.sigmas").to_vector();
  const auto want_t = test::golden("flux-tiny", "run.flux_euler.timesteps").to_vector();
  ASSERT_EQ(s.sigmas().size(), want_sigmas.size());
  ASSERT_EQ(s.timesteps().size(), want_t.size());
  for (size_t i = 0; i < want_sigmas.size(); ++i) EXPECT_EQ(s.sigmas()[i], want_sigmas[i]) << i;
  for (size_t i = 0; i < want_t.size(); ++i) EXPECT_EQ(s.timesteps()[i], want_t[i]) << i;
}

TEST(FluxFlowMatch, StaticShiftDefaultPath) {
  // diffusers: FlowMatchEulerDiscreteScheduler(shift=3.0).set_timesteps(4) (no sigmas, no mu), float64
  // linspace(1000, 1000 * shifted(1/1000), 4) / 1000, shifted, cast to float32.
  FlowMatchConfig c;
  c.shift = 3.0;
  const FlowMatchEuler s = FlowMatchEuler::create(c, 4).value();
  const double smin = double(3.0f * 0.001f / (1.0f + 2.0f * 0.001f));
  ASSERT_EQ(s.sigmas().size(), 5u);
  for (int i = 0; i < 4; ++i) {
    const double u = 1.0 + (smin - 1.0) * i / 3.0;
    EXPECT_FLOAT_EQ(s.sigmas()[i], float(3.0 * u / (1.0 + 2.0 * u))) << i;
    EXPECT_FLOAT_EQ(s.timesteps()[i], s.sigmas()[i] * 1000.0f) << i;
  }
  EXPECT_EQ(s.sigmas()[0], 1.0f);
  EXPECT_EQ(s.sigmas()[4], 0.0f);
  // Z-Image sets sigma_min = 0: the last planned sigma before the terminal one is then 1/3 of the way.
  FlowMatchPlanOptions o;
  o.sigma_min = 0.0;
  const FlowMatchEuler z = FlowMatchEuler::create(c, 3, o).value();
  EXPECT_FLOAT_EQ(z.sigmas()[1], float(3.0 * 0.5 / (1.0 + 2.0 * 0.5)));
  EXPECT_EQ(z.sigmas()[2], 0.0f);
}

TEST(FluxFlowMatch, EulerStepMovesAlongVelocity) {
  FlowMatchConfig c;
  FlowMatchPlanOptions o;
  o.sigmas = std::vector<double>{1.0, 0.5};
  FlowMatchEuler s = FlowMatchEuler::create(c, 0, o).value();
  const Tensor x = Tensor::from_vector({1.0f, 2.0f}, {2});
  const Tensor v = Tensor::from_vector({4.0f, -2.0f}, {2});
  Tensor y = s.step(x, v);  // dt = 0.5 - 1 = -0.5
  EXPECT_EQ(y.to_vector(), (std::vector<float>{-1.0f, 3.0f}));
  EXPECT_EQ(s.step_index(), 1);
  EXPECT_EQ(s.scale_noise(x, v).to_vector(), (std::vector<float>{2.5f, 0.0f}));  // sigma 0.5
  y = s.step(y, v);  // dt = -0.5
  EXPECT_TRUE(s.done());
  EXPECT_EQ(y.to_vector(), (std::vector<float>{-3.0f, 4.0f}));
}

TEST(FluxFlowMatch, Errors) {
  EXPECT_FALSE(FlowMatchEuler::create(flux_dev_config(), 4).has_value());  // mu missing
  EXPECT_FALSE(FlowMatchEuler::create(FlowMatchConfig{}, 0).has_value());
  EXPECT_FALSE(parse_flow_match_config(nlohmann::json{{"use_karras_sigmas", true}}).has_value());
  EXPECT_FALSE(parse_flow_match_config(nlohmann::json{{"time_shift_type", "cosine"}}).has_value());
  EXPECT_EQ(parse_flow_match_config(nlohmann::json{{"shift", 3.0}}).value().shift, 3.0);
}

}  // namespace
}  // namespace atelier::sampling
