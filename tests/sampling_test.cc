// Samplers and noise schedules against diffusers 0.40: plans vs goldens, config resolution vs the configs
// diffusers printed, img2img plans, ideal-denoiser convergence of every sampler, the batched stepper, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "sampling/sampler.h"
#include "sampling/sampler_names.h"
#include "sampling/schedule.h"
#include "sampling/scheduler_config.h"
#include "sampling/stepper.h"
#include "sampling_test_util.h"
#include "test_util.h"

namespace atelier::sampling {
namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json load_json(const std::filesystem::path& p) { return parse_config_json(read_text(p)).value(); }

// Largest |a - b| / max(|b|, 1e-30) (exact zeros must match exactly).
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    m = std::max(m, b[i] == 0 ? (d == 0 ? 0.0 : INFINITY) : d / std::abs(double(b[i])));
  }
  return m;
}

constexpr const char* kGoldenRuns[] = {"euler", "euler_a", "ddim", "dpmpp_2m", "dpmpp_2m_karras", "euler_karras"};
constexpr double kPlanTolerance = 1e-6;

// --- (a) plans against the goldens --------------------------------------------------------------------

TEST(SamplingGolden, TimestepsAndSigmasMatchDiffusers) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const json model = load_json(dir / "model/scheduler/scheduler_config.json");
  const json cases = load_json(dir / "case.json");
  for (const char* run : kGoldenRuns) {
    SCOPED_TRACE(run);
    const int steps = cases["runs"][run]["steps"];
    auto s = make(model, run, steps);
    ASSERT_TRUE(s);
    const std::string prefix = std::string("run.") + run;
    const auto ts = test::golden("sd15-tiny", prefix + ".timesteps").to_vector();
    ASSERT_EQ(s->timesteps().size(), ts.size());
    const double ts_err = max_rel(s->timesteps(), ts);
    EXPECT_LE(ts_err, kPlanTolerance);
    // Stronger than required: every value is bit-equal (torch's FMA linspace and numpy's float32 log are
    // reproduced); a 1-ulp drift here means one of those emulations broke.
    EXPECT_EQ(s->timesteps(), ts);
    double sig_err = 0;
    if (cases["tensors"].contains(prefix + ".sigmas")) {
      const auto sig = test::golden("sd15-tiny", prefix + ".sigmas").to_vector();
      ASSERT_EQ(s->sigmas().size(), sig.size());
      sig_err = max_rel(s->sigmas(), sig);
      EXPECT_LE(sig_err, kPlanTolerance);
      EXPECT_EQ(s->sigmas(), sig);
    }
    std::printf("[ plan ] %-16s timesteps max rel err %.3g, sigmas max rel err %.3g\n", run, ts_err, sig_err);
  }
}

// --- (d) config resolution against what diffusers printed ----------------------------------------------

bool json_number_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

TEST(SamplingConfig, ResolvesLikeFromConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const json model = load_json(dir / "model/scheduler/scheduler_config.json");
  const json cases = load_json(dir / "case.json");
  for (const char* run : kGoldenRuns) {
    SCOPED_TRACE(run);
    const json& expected = cases["scheduler_configs"][run];
    auto spec = parse_sampler(run);
    ASSERT_TRUE(spec.has_value());
    auto cfg = resolve_scheduler_config(model, *spec);
    ASSERT_TRUE(cfg.has_value()) << cfg.status().message();
    EXPECT_EQ(cases["runs"][run]["scheduler"].get<std::string>(), diffusers_class(spec->kind));
    size_t keys = 0;
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      if (it.key().starts_with("_")) continue;
      ++keys;
      ASSERT_TRUE(cfg->resolved.contains(it.key())) << "missing key " << it.key();
      EXPECT_TRUE(json_number_equal(cfg->resolved[it.key()], it.value()))
          << it.key() << ": ours " << cfg->resolved[it.key()].dump() << ", diffusers " << it.value().dump();
    }
    EXPECT_EQ(cfg->resolved.size(), keys) << "our key set differs from the class's init parameters";
    // The overrides each run applied (use_karras_sigmas, algorithm_type ...) are what the name implies.
    const json& run_cfg = cases["runs"][run]["config"];
    for (auto it = run_cfg.begin(); it != run_cfg.end(); ++it) {
      if (cfg->resolved.contains(it.key())) EXPECT_TRUE(json_number_equal(cfg->resolved[it.key()], it.value())) << it.key();
    }
  }
}

TEST(SamplingConfig, ClassDefaultsWithoutModelConfig) {
  auto ddim = resolve_scheduler_config(json(), {SamplerKind::kDDIM});
  ASSERT_TRUE(ddim.has_value());
  EXPECT_EQ(ddim->timestep_spacing, "leading");
  EXPECT_TRUE(ddim->clip_sample);
  EXPECT_TRUE(ddim->set_alpha_to_one);
  EXPECT_EQ(ddim->beta_schedule, "linear");
  auto euler = resolve_scheduler_config(json::object(), {SamplerKind::kEuler});
  ASSERT_TRUE(euler.has_value());
  EXPECT_EQ(euler->timestep_spacing, "linspace");
  EXPECT_EQ(euler->steps_offset, 0);
  auto lcm = resolve_scheduler_config(json(), {SamplerKind::kLCM});
  ASSERT_TRUE(lcm.has_value());
  EXPECT_EQ(lcm->beta_schedule, "scaled_linear");
  EXPECT_EQ(lcm->original_inference_steps, 50);
  // A missing config still gives a working plan (DDIM default: leading spacing, offset 0).
  auto s = make(json(), "ddim", 4);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->timesteps(), (std::vector<float>{750, 500, 250, 0}));
}

TEST(SamplingConfig, UseDefaultValuesOverridesAndPythonFloats) {
  // Keys listed in _use_default_values are treated as absent (the class default wins).
  json cfg = {{"timestep_spacing", "leading"}, {"steps_offset", 1}, {"_use_default_values", {"timestep_spacing"}}};
  auto euler = resolve_scheduler_config(cfg, {SamplerKind::kEuler});
  ASSERT_TRUE(euler.has_value());
  EXPECT_EQ(euler->timestep_spacing, "linspace");
  EXPECT_EQ(euler->steps_offset, 1);
  // Caller overrides win; an unknown key is an error naming the class.
  auto trailing = resolve_scheduler_config(cfg, {SamplerKind::kEuler}, {{"timestep_spacing", "trailing"}});
  ASSERT_TRUE(trailing.has_value());
  EXPECT_EQ(trailing->timestep_spacing, "trailing");
  auto bad = resolve_scheduler_config(cfg, {SamplerKind::kDDIM}, {{"use_karras_sigmas", true}});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("DDIMScheduler"), std::string::npos) << bad.status().message();
  // Keys of other classes in the model config are ignored (PNDM's skip_prk_steps for Euler).
  auto pndm = resolve_scheduler_config({{"skip_prk_steps", true}}, {SamplerKind::kEuler});
  ASSERT_TRUE(pndm.has_value());
  EXPECT_FALSE(pndm->resolved.contains("skip_prk_steps"));
  // Python's json floats.
  auto parsed = parse_config_json(R"({"lambda_min_clipped": -Infinity, "name": "-Infinity NaN", "x": NaN})");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_TRUE(std::isinf((*parsed)["lambda_min_clipped"].get<double>()));
  EXPECT_EQ((*parsed)["name"], "-Infinity NaN");
  EXPECT_TRUE(std::isnan((*parsed)["x"].get<double>()));
  auto dpm = resolve_scheduler_config(*parsed, {SamplerKind::kDPMpp2M});
  ASSERT_TRUE(dpm.has_value());
  EXPECT_LT(dpm->lambda_min_clipped, -1e300);
  // A wrong type is reported with the key.
  auto typed = resolve_scheduler_config({{"steps_offset", "one"}}, {SamplerKind::kEuler});
  ASSERT_FALSE(typed.has_value());
  EXPECT_NE(typed.status().message().find("steps_offset"), std::string::npos);
}

// --- names and errors (e) ---------------------------------------------------------------------------

TEST(SamplingNames, OursAndA1111) {
  struct Case {
    const char* name;
    SamplerKind kind;
    ScheduleKind schedule;
  };
  const Case cases[] = {
      {"euler", SamplerKind::kEuler, ScheduleKind::kDefault},
      {"Euler", SamplerKind::kEuler, ScheduleKind::kDefault},
      {"euler_a", SamplerKind::kEulerAncestral, ScheduleKind::kDefault},
      {"Euler a", SamplerKind::kEulerAncestral, ScheduleKind::kDefault},
      {"heun", SamplerKind::kHeun, ScheduleKind::kDefault},
      {"Heun", SamplerKind::kHeun, ScheduleKind::kDefault},
      {"DDIM", SamplerKind::kDDIM, ScheduleKind::kDefault},
      {"LCM", SamplerKind::kLCM, ScheduleKind::kDefault},
      {"dpmpp_2m", SamplerKind::kDPMpp2M, ScheduleKind::kDefault},
      {"DPM++ 2M", SamplerKind::kDPMpp2M, ScheduleKind::kDefault},
      {"DPM++ 2M Karras", SamplerKind::kDPMpp2M, ScheduleKind::kKarras},
      {"dpmpp_2m_karras", SamplerKind::kDPMpp2M, ScheduleKind::kKarras},
      {"DPM++ 2M SDE", SamplerKind::kDPMpp2MSDE, ScheduleKind::kDefault},
      {"DPM++ 2M SDE Karras", SamplerKind::kDPMpp2MSDE, ScheduleKind::kKarras},
      {"dpmpp_2m_sde_exponential", SamplerKind::kDPMpp2MSDE, ScheduleKind::kExponential},
      {"euler_karras", SamplerKind::kEuler, ScheduleKind::kKarras},
  };
  for (const Case& c : cases) {
    auto spec = parse_sampler(c.name);
    ASSERT_TRUE(spec.has_value()) << c.name << ": " << spec.status().message();
    EXPECT_EQ(spec->kind, c.kind) << c.name;
    EXPECT_EQ(spec->schedule, c.schedule) << c.name;
  }
  for (const std::string& n : supported_sampler_names()) EXPECT_TRUE(parse_sampler(n).has_value()) << n;
}

TEST(SamplingErrors, ClearMessages) {
  auto unknown = parse_sampler("DPM++ 3M");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.status().message().find("Euler a"), std::string::npos) << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("dpmpp_2m"), std::string::npos);

  auto ancestral_karras = parse_sampler("Euler a Karras");
  ASSERT_FALSE(ancestral_karras.has_value());
  EXPECT_NE(ancestral_karras.status().message().find("euler, heun, dpmpp_2m, dpmpp_2m_sde"), std::string::npos)
      << ancestral_karras.status().message();
  auto ddim_exp = with_schedule({SamplerKind::kDDIM}, ScheduleKind::kExponential);
  ASSERT_FALSE(ddim_exp.has_value());
  auto conflict = with_schedule(parse_sampler("DPM++ 2M Karras").value(), ScheduleKind::kExponential);
  EXPECT_FALSE(conflict.has_value());
  EXPECT_FALSE(parse_schedule("cosine").has_value());

  for (int steps : {0, -3}) {
    auto s = make_sampler(json(), "euler", steps);
    ASSERT_FALSE(s.has_value());
    EXPECT_NE(s.status().message().find("steps"), std::string::npos);
  }
  EXPECT_FALSE(make_sampler(json(), "ddim", 1001).has_value());
  EXPECT_FALSE(make_sampler(json(), "euler", kMaxSteps + 1).has_value());
  EXPECT_FALSE(make_sampler(json(), "lcm", 51).has_value());  // > original_inference_steps
  auto thresholding = make_sampler(json{{"thresholding", true}}, "ddim", 4);
  ASSERT_FALSE(thresholding.has_value());
  EXPECT_NE(thresholding.status().message().find("thresholding"), std::string::npos);
  EXPECT_FALSE(make_sampler(json{{"beta_schedule", "cubic"}}, "euler", 4).has_value());
  EXPECT_FALSE(make_sampler(json{{"prediction_type", "sample"}}, "euler_a", 4).has_value());

  // Schedule values that give NaN or negative sigmas, or tables of any length, are config errors naming the key
  // (they surfaced as "sampler update uses an operand that is not available", or ate 20 GB, before).
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [config, key, sampler] : std::vector<std::tuple<json, std::string, std::string>>{
           {{{"beta_end", 2.0}}, "beta_end", "euler"},
           {{{"beta_start", -1.0}}, "beta_start", "dpmpp_2m"},
           {{{"beta_schedule", "scaled_linear"}, {"beta_start", std::nan("")}}, "beta_start", "euler"},
           {{{"num_train_timesteps", 2}, {"trained_betas", {0.5, 1.0}}}, "trained_betas", "ddim"},
           {{{"num_train_timesteps", 2000000000}}, "num_train_timesteps", "euler"},
           {{{"num_train_timesteps", 4294967396}}, "num_train_timesteps", "euler"},  // 2^32 + 100: read as 100 before
           {{{"steps_offset", "1"}}, "steps_offset", "ddim"},
           {{{"sigma_max", -5.0}}, "sigma_max", "euler"},
           {{{"sigma_min", inf}}, "sigma_min", "euler"},
           {{{"clip_sample", true}, {"clip_sample_range", -1.0}}, "clip_sample_range", "ddim"}}) {
    auto bad = make_sampler(config, sampler, 4);
    ASSERT_FALSE(bad.has_value()) << config.dump();
    EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument) << config.dump();
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status().message();
  }
  EXPECT_TRUE(make_sampler(json{{"beta_start", 0.0}, {"beta_end", 0.02}}, "euler", 4).has_value());
  EXPECT_TRUE(make_sampler(json{{"beta_schedule", "squaredcos_cap_v2"}, {"beta_start", 5.0}}, "ddim", 4).has_value())
      << "beta_start is not used by squaredcos_cap_v2";

  auto s = make_sampler(json(), "euler", 4).value();
  EXPECT_FALSE(s->set_strength(1.5).is_ok());
  EXPECT_FALSE(s->set_strength(-0.1).is_ok());
  EXPECT_FALSE(s->set_strength(0.1).is_ok());  // int(4 * 0.1) = 0 steps left
}

// --- schedules -----------------------------------------------------------------------------------------

TEST(SamplingSchedule, NumpyHelpers) {
  // numpy's float32 log is off by an ulp here; diffusers' Karras timesteps depend on it.
  EXPECT_EQ(numpy_log_f32(0.1673143208026886f), -1.7878811359405518f);
  EXPECT_EQ(numpy_log_f32(2.2361273765563965f), 0.8047455549240112f);
  EXPECT_EQ(numpy_log_f32(1.0f), 0.0f);
  EXPECT_TRUE(std::isinf(numpy_log_f32(0.0f)));
  EXPECT_EQ(np_round(2.5), 2.0);
  EXPECT_EQ(np_round(3.5), 4.0);
  EXPECT_EQ(np_round(-2.5), -2.0);
  EXPECT_EQ(np_round(2.6), 3.0);
  EXPECT_EQ(np_arange(1000, 0, -1000.0 / 3).size(), 3u);
  const auto l = np_linspace(0, 999, 4);
  EXPECT_EQ(l, (std::vector<double>{0, 333, 666, 999}));
  EXPECT_EQ(np_linspace(0, 10, 5, false), (std::vector<double>{0, 2, 4, 6, 8}));
  // sigma_to_t inverts the table at integer timesteps.
  SchedulerConfig c = resolve_scheduler_config({{"beta_schedule", "scaled_linear"}}, {SamplerKind::kEuler}).value();
  const TrainSchedule ts = make_train_schedule(c).value();
  for (int t : {0, 1, 250, 998, 999}) EXPECT_NEAR(sigma_to_t(ts.sigmas[size_t(t)], ts.log_sigmas), t, 1e-3) << t;
}

TEST(SamplingSchedule, SpacingsAndSchedules) {
  const json sd = {{"beta_schedule", "scaled_linear"}, {"beta_start", 0.00085}, {"beta_end", 0.012},
                   {"steps_offset", 1}};
  // diffusers' values for 10 steps.
  auto ddim_trailing = make(sd, "ddim", 10, {{"timestep_spacing", "trailing"}});
  EXPECT_EQ(ddim_trailing->timesteps(), (std::vector<float>{999, 899, 799, 699, 599, 499, 399, 299, 199, 99}));
  auto ddim_linspace = make(sd, "ddim", 10, {{"timestep_spacing", "linspace"}});
  EXPECT_EQ(ddim_linspace->timesteps(), (std::vector<float>{999, 888, 777, 666, 555, 444, 333, 222, 111, 0}));
  auto euler_leading = make(sd, "euler", 10, {{"timestep_spacing", "leading"}});
  EXPECT_EQ(euler_leading->timesteps(), (std::vector<float>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
  // Leading spacing: init_noise_sigma = sqrt(max sigma^2 + 1).
  const float smax = euler_leading->sigmas().front();
  EXPECT_FLOAT_EQ(euler_leading->init_noise_sigma(), std::sqrt(smax * smax + 1));
  auto dpm_leading = make(sd, "dpmpp_2m", 10, {{"timestep_spacing", "leading"}});
  EXPECT_EQ(dpm_leading->timesteps(), (std::vector<float>{901, 811, 721, 631, 541, 451, 361, 271, 181, 91}));
  auto lcm = make(sd, "lcm", 4);
  EXPECT_EQ(lcm->timesteps(), (std::vector<float>{999, 759, 499, 259}));
  // Heun doubles its lists; Karras and exponential schedules are monotone and end at 0.
  auto heun = make(sd, "heun", 4);
  EXPECT_EQ(heun->timesteps().size(), 7u);
  EXPECT_EQ(heun->sigmas().size(), 8u);
  EXPECT_EQ(heun->timesteps()[1], heun->timesteps()[2]);
  for (const char* name : {"euler_karras", "euler_exponential", "heun_karras", "dpmpp_2m_exponential", "dpmpp_2m_sde_karras"}) {
    auto s = make(sd, name, 8);
    ASSERT_TRUE(s);
    for (size_t i = 1; i < s->sigmas().size(); ++i) EXPECT_LE(s->sigmas()[i], s->sigmas()[i - 1]) << name;
    EXPECT_EQ(s->sigmas().back(), 0.0f) << name;
  }
  // final_sigmas_type sigma_min ends on the smallest training sigma.
  auto euler_min = make(sd, "euler", 4, {{"final_sigmas_type", "sigma_min"}});
  EXPECT_EQ(euler_min->sigmas().back(), euler_min->train_schedule().sigmas.front());
}

// --- (b) img2img plan ----------------------------------------------------------------------------------

TEST(SamplingImg2Img, DDIMStrengthPlan) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const json model = load_json(dir / "model/scheduler/scheduler_config.json");
  const json i2i = load_json(dir / "case.json")["img2img"];
  auto s = make(model, "ddim", i2i["steps"].get<int>());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->set_strength(i2i["strength"].get<double>()).is_ok());
  // leading spacing, step ratio 100, steps_offset 1: [901 .. 1]; t_start = 10 - int(10 * 0.6) = 4.
  EXPECT_EQ(s->begin_index(), 4);
  EXPECT_EQ(s->calls_remaining(), 6);
  std::vector<float> planned(s->timesteps().begin() + s->begin_index(), s->timesteps().end());
  EXPECT_EQ(planned, (std::vector<float>{501, 401, 301, 201, 101, 1}));
  EXPECT_EQ(s->next_call().timestep, 501.0f);
  EXPECT_EQ(s->next_call().input_scale, 1.0f);
  // add_noise at t=501: sqrt(alpha_bar) and sqrt(1 - alpha_bar) (values from diffusers' float32 tables).
  const NoiseRule r = s->noise_rule();
  EXPECT_NEAR(r.x0, 0.5244033336639404, 1e-7);
  EXPECT_NEAR(r.noise, 0.8514699935913086, 1e-7);
  // Euler-type samplers noise with sigma at the begin index; Heun's begin index counts model calls.
  auto heun = make(model, "heun", 10);
  ASSERT_TRUE(heun->set_strength(0.6).is_ok());
  EXPECT_EQ(heun->begin_index(), 8);
  EXPECT_EQ(heun->calls_remaining(), 11);
  EXPECT_EQ(heun->noise_rule().noise, heun->sigmas()[8]);
  auto dpm = make(model, "dpmpp_2m", 10);
  ASSERT_TRUE(dpm->set_strength(0.6).is_ok());
  const float sd = dpm->sigmas()[4];
  EXPECT_FLOAT_EQ(dpm->noise_rule().x0, 1.0f / std::sqrt(sd * sd + 1));
  EXPECT_FLOAT_EQ(dpm->noise_rule().noise, sd / std::sqrt(sd * sd + 1));
}

// --- (c) an ideal denoiser for a point-mass data distribution --------------------------------------------

// The exact model output for data concentrated at x0: eps, v or x0 itself.
std::vector<float> ideal_output(const Sampler& s, const std::vector<float>& x, const std::vector<float>& x0) {
  const auto [alpha, sigma] = model_noise_level(s);
  const double scale = s.next_call().input_scale;
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double eps = (scale * x[i] - alpha * x0[i]) / sigma;
    const std::string& p = s.config().prediction_type;
    out[i] = float(p == "epsilon" ? eps : p == "v_prediction" ? alpha * eps - sigma * x0[i] : x0[i]);
  }
  return out;
}

// Applies StepUpdates on host vectors, independently of ops (the reference for the batched stepper).
struct HostRun {
  std::vector<float> x;
  std::array<std::vector<float>, kNumSavedSlots> saved;

  void step(Sampler& s, const std::vector<float>& m) {
    const StepUpdate u = s.update();
    std::vector<float> noise(x.size(), 0.0f), clamped(x.size(), 0.0f);
    if (u.draws_noise) noise = s.noise_source()({1, int64_t(x.size())}).to_vector();
    auto eval = [&](const LinearExpr& e, size_t i) {
      const double ops[kNumOperands] = {x[i], m[i], noise[i], clamped[i],
                                        saved[0].empty() ? 0.0 : saved[0][i], saved[1].empty() ? 0.0 : saved[1][i]};
      double acc = 0;
      for (int o = 0; o < kNumOperands; ++o) acc += e.coeff[size_t(o)] * ops[o];
      return float(acc);
    };
    for (size_t i = 0; u.clamp && i < x.size(); ++i) {
      clamped[i] = std::clamp(eval(u.clamp->source, i), -u.clamp->range, u.clamp->range);
    }
    std::vector<float> next(x.size());
    std::array<std::vector<float>, kNumSavedSlots> new_saved = saved;
    for (size_t i = 0; i < x.size(); ++i) next[i] = eval(u.next_sample, i);
    for (int k = 0; k < kNumSavedSlots; ++k) {
      const SlotWrite& w = u.saves[size_t(k)];
      if (w.action == SlotWrite::Action::kClear) new_saved[size_t(k)].clear();
      if (w.action == SlotWrite::Action::kSet) {
        new_saved[size_t(k)].resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) new_saved[size_t(k)][i] = eval(w.value, i);
      }
    }
    x = next;
    saved = new_saved;
    s.advance({});
  }
};

const std::vector<float> kPointMass = {0.5f, -0.25f, 0.75f, 0.0f, -0.9f, 0.1f, 0.3f, -0.6f};

// Runs a whole txt2img plan with the ideal denoiser; returns max |x_final - x0|.
double converge(Sampler& s, uint32_t seed) {
  if (!s.noise_source()) s.set_noise_source(gaussian_source(seed + 1));
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd;
  HostRun run;
  for (size_t i = 0; i < kPointMass.size(); ++i) run.x.push_back(nd(gen) * s.init_noise_sigma());
  while (!s.done()) run.step(s, ideal_output(s, run.x, kPointMass));
  double err = 0;
  for (size_t i = 0; i < kPointMass.size(); ++i) err = std::max(err, double(std::abs(run.x[i] - kPointMass[i])));
  return err;
}

constexpr double kConvergeTolerance = 1e-4;

TEST(SamplingConverge, EverySamplerLandsOnThePointMass) {
  const json sd = {{"beta_schedule", "scaled_linear"}, {"beta_start", 0.00085}, {"beta_end", 0.012},
                   {"steps_offset", 1}, {"clip_sample", false}, {"set_alpha_to_one", true}};
  // (DDIM lands on x0 only when its last step goes to alpha_bar = 1: set_alpha_to_one and a last timestep
  // below T // steps, true for these spacings and step counts.)
  const char* names[] = {"euler", "euler_a", "heun", "ddim", "dpmpp_2m", "dpmpp_2m_sde", "lcm",
                         "euler_karras", "euler_exponential", "heun_karras", "dpmpp_2m_karras",
                         "dpmpp_2m_exponential", "dpmpp_2m_sde_karras"};
  const char* predictions[] = {"epsilon", "v_prediction", "sample"};
  for (const char* name : names) {
    for (const char* pred : predictions) {
      const SamplerKind kind = parse_sampler(name).value().kind;
      if (kind == SamplerKind::kEulerAncestral && std::string(pred) == "sample") continue;
      for (int steps : {1, 4, 9}) {
        for (const char* spacing : {"linspace", "leading", "trailing"}) {
          json o = {{"prediction_type", pred}};
          if (kind != SamplerKind::kLCM) o["timestep_spacing"] = spacing;
          auto s = make(sd, name, steps, o);
          ASSERT_TRUE(s);
          const double err = converge(*s, uint32_t(steps * 31 + 7));
          EXPECT_LE(err, kConvergeTolerance) << name << " " << pred << " " << steps << " steps " << spacing;
        }
      }
    }
  }
}

TEST(SamplingConverge, ClippingAndZeroSnrAndImg2Img) {
  // DDIM's class defaults clip x0 to [-1, 1] (the point mass lies inside, so it still converges).
  auto ddim = make(json(), "ddim", 8);
  ASSERT_TRUE(ddim->config().clip_sample);
  EXPECT_LE(converge(*ddim, 3), kConvergeTolerance);
  auto heun_clip = make(json{{"clip_sample", true}}, "heun", 5);
  EXPECT_LE(converge(*heun_clip, 4), kConvergeTolerance);
  for (const char* name : {"euler", "dpmpp_2m", "ddim"}) {
    auto s = make(json{{"rescale_betas_zero_snr", true}, {"beta_schedule", "scaled_linear"},
                       {"timestep_spacing", "trailing"}, {"prediction_type", "v_prediction"}},
                  name, 5);
    EXPECT_LE(converge(*s, 5), kConvergeTolerance) << name;
  }
  // img2img: noise the point mass at the begin index with noise_rule, then run the remaining calls.
  for (const char* name : {"euler", "euler_a", "heun", "ddim", "dpmpp_2m", "dpmpp_2m_sde", "lcm"}) {
    auto s = make(json{{"beta_schedule", "scaled_linear"}, {"steps_offset", 1}}, name, 10);
    ASSERT_TRUE(s->set_strength(0.45).is_ok());
    s->set_noise_source(gaussian_source(11));
    const NoiseRule r = s->noise_rule();
    HostRun run;
    for (float v : kPointMass) run.x.push_back(r.x0 * v + r.noise * 0.7f);
    int calls = 0;
    while (!s->done()) {
      run.step(*s, ideal_output(*s, run.x, kPointMass));
      ++calls;
    }
    EXPECT_EQ(calls, s->order() * 4 - (s->order() - 1)) << name;  // 4 steps; Heun's last step is one call
    for (size_t i = 0; i < kPointMass.size(); ++i) EXPECT_NEAR(run.x[i], kPointMass[i], kConvergeTolerance) << name;
  }
}

// The clamp is really applied: an x0 outside the range is pulled to it.
TEST(SamplingConverge, ClampIsApplied) {
  auto s = make(json(), "ddim", 3);  // clip_sample true by default
  std::vector<float> far = {3.0f, -2.0f, 0.5f, 0, 0, 0, 0, 0};
  HostRun run;
  run.x.assign(far.size(), 0.2f);
  while (!s->done()) run.step(*s, ideal_output(*s, run.x, far));
  EXPECT_NEAR(run.x[0], 1.0f, 1e-5);
  EXPECT_NEAR(run.x[1], -1.0f, 1e-5);
  EXPECT_NEAR(run.x[2], 0.5f, 1e-4);
}

// The noise draws: once per model call for euler_a and dpmpp_2m_sde (the last included), every step but
// the last for LCM, never for the deterministic samplers; always with the sample's shape.
TEST(SamplingConverge, NoiseDrawOrder) {
  for (const char* name : {"euler", "euler_a", "heun", "ddim", "dpmpp_2m", "dpmpp_2m_sde", "lcm"}) {
    auto s = make(json(), name, 5);
    int draws = 0;
    s->set_noise_source([&](const Shape& shape) {
      EXPECT_EQ(shape, (Shape{1, 8}));
      ++draws;
      return Tensor::zeros(shape);
    });
    converge(*s, 1);
    (void)s;
    const SamplerKind k = parse_sampler(name).value().kind;
    const int expected = k == SamplerKind::kEulerAncestral || k == SamplerKind::kDPMpp2MSDE ? 5 : k == SamplerKind::kLCM ? 4 : 0;
    EXPECT_EQ(draws, expected) << name;
  }
}

// --- the batched stepper --------------------------------------------------------------------------------

// Seven samplers of every kind, with different step counts, advanced together in one batch (different
// phases: Heun's first and second stages, DPM-Solver's first and second orders, noise draws, a clamp) must
// match each sample advanced alone on the host.
TEST(SamplingStepper, MixedBatchMatchesPerSampleHost) {
  const json sd = {{"beta_schedule", "scaled_linear"}, {"beta_start", 0.00085}, {"beta_end", 0.012},
                   {"steps_offset", 1}, {"clip_sample", false}, {"set_alpha_to_one", false}};
  const char* names[] = {"euler", "euler_a", "heun", "ddim", "dpmpp_2m_karras", "dpmpp_2m_sde", "lcm"};
  const int steps[] = {6, 5, 4, 7, 6, 5, 4};
  constexpr int64_t kC = 4, kH = 3, kW = 5;
  constexpr size_t kPer = kC * kH * kW;
  std::vector<std::unique_ptr<Sampler>> batch_samplers, host_samplers;
  std::vector<HostRun> host(std::size(names));
  std::vector<std::vector<float>> target(std::size(names));
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < std::size(names); ++i) {
    const json o = i == 3 ? json{{"clip_sample", true}} : json::object();  // ddim clamps
    batch_samplers.push_back(make(sd, names[i], steps[i], o));
    host_samplers.push_back(make(sd, names[i], steps[i], o));
    batch_samplers.back()->set_noise_source(gaussian_source(uint32_t(100 + i)));
    host_samplers.back()->set_noise_source(gaussian_source(uint32_t(100 + i)));
    for (size_t k = 0; k < kPer; ++k) {
      target[i].push_back(1.3f * nd(gen));  // partly outside ddim's clip range
      host[i].x.push_back(nd(gen) * batch_samplers.back()->init_noise_sigma());
    }
  }
  // The host reference draws noise with the same shape as the stepper ([1, C, H, W]).
  auto host_step = [&](size_t i, const std::vector<float>& m) {
    Sampler& s = *host_samplers[i];
    auto source = s.noise_source();
    s.set_noise_source([source](const Shape&) { return source({1, kC, kH, kW}); });
    host[i].step(s, m);
    s.set_noise_source(source);
  };
  Tensor x;
  {
    std::vector<float> all;
    for (const HostRun& h : host) all.insert(all.end(), h.x.begin(), h.x.end());
    x = Tensor::from_vector(all, {int64_t(std::size(names)), kC, kH, kW});
  }
  int rounds = 0;
  double worst = 0;
  while (true) {
    std::vector<Sampler*> active;
    std::vector<size_t> idx;
    for (size_t i = 0; i < batch_samplers.size(); ++i) {
      if (!batch_samplers[i]->done()) {
        active.push_back(batch_samplers[i].get());
        idx.push_back(i);
      }
    }
    if (active.empty()) break;
    // Rebuild the batch from the active rows (samples leave the batch as they finish).
    std::vector<float> xs, ms, scaled_expected;
    const auto xv = x.to_vector();
    for (size_t r = 0; r < idx.size(); ++r) {
      const size_t i = idx[r];
      std::vector<float> xi(xv.begin() + long(r * kPer), xv.begin() + long((r + 1) * kPer));
      const auto m = ideal_output(*active[r], xi, target[i]);
      xs.insert(xs.end(), xi.begin(), xi.end());
      ms.insert(ms.end(), m.begin(), m.end());
      for (float v : xi) scaled_expected.push_back(v * active[r]->next_call().input_scale);
    }
    const Shape shape = {int64_t(idx.size()), kC, kH, kW};
    const Tensor xb = Tensor::from_vector(xs, shape), mb = Tensor::from_vector(ms, shape);
    EXPECT_LE(max_rel(scale_model_inputs(active, xb).to_vector(), scaled_expected), 1e-6);
    Tensor denoised;
    const Tensor next = apply_step(active, xb, mb, &denoised);
    EXPECT_EQ(denoised.shape(), shape);
    const auto nv = next.to_vector();
    for (size_t r = 0; r < idx.size(); ++r) {
      const size_t i = idx[r];
      host_step(i, std::vector<float>(ms.begin() + long(r * kPer), ms.begin() + long((r + 1) * kPer)));
      const std::vector<float> got(nv.begin() + long(r * kPer), nv.begin() + long((r + 1) * kPer));
      // float32 lincomb vs the host's double evaluation: a few ulps of the largest magnitude.
      double scale = 1;
      for (float v : host[i].x) scale = std::max(scale, double(std::abs(v)));
      const double err = test::max_abs_diff(got, host[i].x) / scale;
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-5) << names[i] << " call " << host_samplers[i]->call_index();
    }
    // Keep only the rows that are still running.
    std::vector<float> kept;
    for (size_t r = 0; r < idx.size(); ++r) {
      if (!active[r]->done()) kept.insert(kept.end(), nv.begin() + long(r * kPer), nv.begin() + long((r + 1) * kPer));
    }
    if (!kept.empty()) x = Tensor::from_vector(kept, {int64_t(kept.size() / kPer), kC, kH, kW});
    ++rounds;
  }
  EXPECT_EQ(rounds, 7);  // heun: 4 steps = 7 model calls, the longest plan
  std::printf("[ stepper ] mixed batch vs host: max diff %.3g (relative to the largest |x|)\n", worst);
  for (size_t i = 0; i < host.size(); ++i) {
    if (i == 3) continue;  // ddim clips the out-of-range target
    for (size_t k = 0; k < kPer; ++k) EXPECT_NEAR(host[i].x[k], target[i][k], 1e-3) << names[i];
  }
}

// Sampler::step on a plain tensor (any shape; the noise source gets that shape) and saved tensors that
// stay views of the batch while its order is unchanged.
TEST(SamplingStepper, SingleSampleStepAndZeroCopySaves) {
  const json sd = {{"beta_schedule", "scaled_linear"}, {"steps_offset", 1}};
  auto s = make(sd, "dpmpp_2m_sde", 5);
  Shape seen;
  auto source = gaussian_source(9);
  s->set_noise_source([&](const Shape& shape) { seen = shape; return source(shape); });
  auto ref = make(sd, "dpmpp_2m_sde", 5);
  ref->set_noise_source(gaussian_source(9));
  HostRun host;
  host.x.assign(kPointMass.size(), 0.3f);
  Tensor x = Tensor::from_vector(host.x, {2, 4});
  while (!s->done()) {
    const auto m = ideal_output(*s, x.to_vector(), kPointMass);
    x = s->step(x, Tensor::from_vector(m, {2, 4}));
    EXPECT_EQ(seen, (Shape{2, 4}));
    auto src = ref->noise_source();
    ref->set_noise_source([src](const Shape&) { return src({2, 4}); });
    host.step(*ref, m);
    ref->set_noise_source(src);
    EXPECT_LE(test::max_abs_diff(x.to_vector(), host.x), 1e-5);
  }
  EXPECT_EQ(x.shape(), (Shape{2, 4}));

  // Two DPM-Solver samples: after a step their saved x0 predictions are rows of one batched tensor.
  auto a = make(sd, "dpmpp_2m", 4), b = make(sd, "dpmpp_2m", 6);
  Sampler* both[] = {a.get(), b.get()};
  Tensor xb = Tensor::full({2, 3}, 0.5f);
  xb = apply_step(both, xb, Tensor::full({2, 3}, 0.1f));
  ASSERT_TRUE(a->saved(0).defined());
  EXPECT_EQ(a->saved(0).buffer(), b->saved(0).buffer());
  EXPECT_EQ(b->saved(0).offset(), a->saved(0).offset() + 3);
  xb = apply_step(both, xb, Tensor::full({2, 3}, 0.1f));  // second order reads the batched slot
  EXPECT_EQ(a->call_index(), 2);
}

}  // namespace
}  // namespace atelier::sampling
