// JSON file reading and typed getters: error kinds and messages, defaults, and a fuzz pass over a real
// diffusers config.json (every truncation plus seeded byte flips) that must never crash.
#include "io/json_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("atelier_json_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(JsonUtil, ReadsFileAndReportsMissing) {
  const fs::path p = write_temp("ok.json", R"({"a": 1})");
  auto j = read_json_file(p.string());
  ASSERT_TRUE(j.has_value()) << j.status().message();
  EXPECT_EQ((*j)["a"], 1);
  fs::remove(p);
  auto missing = read_json_file(p.string());
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find(p.string()), std::string::npos);
  auto dir = read_json_file(fs::temp_directory_path().string());
  EXPECT_EQ(dir.status().code(), ErrorCode::kInvalidArgument);
}

TEST(JsonUtil, SyntaxErrorNamesLineAndColumn) {
  const fs::path p = write_temp("bad.json", "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n");
  auto j = read_json_file(p.string());
  ASSERT_FALSE(j.has_value());
  EXPECT_EQ(j.status().code(), ErrorCode::kCorrupt);
  const std::string& m = j.status().message();
  EXPECT_NE(m.find(p.string()), std::string::npos) << m;
  EXPECT_NE(m.find("line 3, column 14"), std::string::npos) << m;  // the second ','
  fs::remove(p);
  auto e = parse_json("", "empty");
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.status().message().find("empty: JSON syntax error at line 1, column 1"), std::string::npos)
      << e.status().message();
}

TEST(JsonUtil, TypedGettersWithDefaults) {
  const json j = json::parse(R"({"f": 0.5, "i": 3, "fi": 2.0, "b": true, "s": "x", "n": null,
                                 "fa": [1, 2.5], "ia": [1, 2], "sa": ["a", "b"], "big": 18446744073709551615})");
  EXPECT_EQ(get_number(j, "f", 1.0).value(), 0.5);
  EXPECT_EQ(get_number(j, "i", 1.0).value(), 3.0);
  EXPECT_EQ(get_number(j, "absent", 1.25).value(), 1.25);
  EXPECT_EQ(get_number(j, "n", 1.25).value(), 1.25);  // null means "not set"
  EXPECT_EQ(get_int(j, "i", 0).value(), 3);
  EXPECT_EQ(get_int(j, "fi", 0).value(), 2);
  EXPECT_EQ(get_bool(j, "b", false).value(), true);
  EXPECT_EQ(get_string(j, "s", "d").value(), "x");
  EXPECT_EQ(get_string(j, "absent", "d").value(), "d");
  EXPECT_EQ(get_numbers(j, "fa", {}).value(), (std::vector<double>{1, 2.5}));
  EXPECT_EQ(get_ints(j, "ia", {}).value(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(get_ints(j, "absent", {7}).value(), (std::vector<int64_t>{7}));
  EXPECT_EQ(get_strings(j, "sa", {}).value(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(require_int(j, "i").value(), 3);
  EXPECT_EQ(require_string(j, "s").value(), "x");
  EXPECT_TRUE(require_bool(j, "b").value());
  EXPECT_EQ(require_number(j, "f").value(), 0.5);
}

TEST(JsonUtil, WrongTypesGiveClearErrors) {
  const json j = json::parse(R"({"f": 0.5, "s": "x", "ia": [1, "2"], "big": 18446744073709551615, "n": null})");
  auto e1 = get_number(j, "s", 1.0, "unet/config.json");
  ASSERT_FALSE(e1.has_value());
  EXPECT_EQ(e1.status().message(), "unet/config.json: key 's': expected a number, got string \"x\"");
  auto e2 = get_int(j, "f", 0);
  ASSERT_FALSE(e2.has_value());
  EXPECT_EQ(e2.status().message(), "key 'f': expected an integer, got number 0.5");
  EXPECT_FALSE(get_int(j, "big", 0).has_value());  // beyond int64
  EXPECT_FALSE(get_bool(j, "s", false).has_value());
  EXPECT_FALSE(get_string(j, "f", "").has_value());
  auto e3 = get_ints(j, "ia", {}, "cfg");
  ASSERT_FALSE(e3.has_value());
  EXPECT_EQ(e3.status().message(), "cfg: key 'ia' element 1: expected an integer, got string \"2\"");
  EXPECT_FALSE(get_numbers(j, "f", {}).has_value());  // scalar where an array is expected
  auto e4 = require_int(j, "n", "cfg");
  ASSERT_FALSE(e4.has_value());
  EXPECT_EQ(e4.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(e4.status().message(), "cfg: required key 'n' is missing");
  auto e5 = get_int(json::array({1}), "k", 0, "cfg");
  ASSERT_FALSE(e5.has_value());
  EXPECT_NE(e5.status().message().find("expected a JSON object"), std::string::npos);
}

TEST(JsonUtil, ReadsFixtureUNetConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto j = read_json_file((dir / "model/unet/config.json").string());
  ASSERT_TRUE(j.has_value()) << j.status().message();
  EXPECT_EQ(get_string(*j, "_class_name", "").value(), "UNet2DConditionModel");
  EXPECT_EQ(get_ints(*j, "block_out_channels", {}).value(), (std::vector<int64_t>{32, 64, 64, 64}));
  EXPECT_EQ(get_int(*j, "addition_time_embed_dim", -1).value(), -1);  // null in the file
}

// Every input must give an error or a value; a value must be the same as parsing with nlohmann directly.
void check_json_input(const std::string& text, const std::string& what, int* accepted) {
  auto j = parse_json(text, "fuzz");
  bool direct_ok = true;
  json direct;
  try {
    direct = json::parse(text);
  } catch (const json::exception&) {
    direct_ok = false;
  }
  EXPECT_EQ(j.has_value(), direct_ok) << what;
  if (j.has_value()) {
    ++*accepted;
    if (direct_ok) EXPECT_EQ(*j, direct) << what;
    // Typed getters on arbitrary JSON must also never throw.
    (void)get_int(*j, "sample_size", 0);
    (void)get_ints(*j, "block_out_channels", {});
    (void)get_string(*j, "_class_name", "");
  } else {
    EXPECT_NE(j.status().message().find("fuzz: "), std::string::npos) << what;
  }
}

TEST(JsonUtil, FuzzTruncationsAndFlipsOfRealConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  std::ifstream in(dir / "model/vae/config.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string seed = ss.str();
  ASSERT_GT(seed.size(), 100u);
  int inputs = 0, accepted = 0;
  for (size_t n = 0; n <= seed.size(); ++n) {
    check_json_input(seed.substr(0, n), "truncated to " + std::to_string(n), &accepted);
    ++inputs;
  }
  std::mt19937 rng(777);
  for (int k = 0; k < 500; ++k) {
    std::string s = seed;
    const int flips = 1 + int(rng() % 3);
    for (int f = 0; f < flips; ++f) s[rng() % s.size()] = char(rng() % 256);
    check_json_input(s, "flip #" + std::to_string(k), &accepted);
    ++inputs;
  }
  // A few through the file reader too (its own error path: the file name in the message).
  for (int k = 0; k < 20; ++k) {
    const fs::path p = write_temp("fuzz.json", seed.substr(0, seed.size() * k / 20));
    auto j = read_json_file(p.string());
    if (!j.has_value()) EXPECT_NE(j.status().message().find(p.string()), std::string::npos);
    fs::remove(p);
    ++inputs;
  }
  EXPECT_GT(inputs, 1000);
  EXPECT_GT(accepted, 1);  // the full file and flips inside string values parse
  std::printf("[fuzz] %d inputs, %d parsed\n", inputs, accepted);
}

}  // namespace
}  // namespace atelier
