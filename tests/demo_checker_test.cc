// The demo checker (tests/demo_checker.h) on images drawn by the generator (tests/data/demo, made by
// tools/demo_model/shapes.py): every caption must pass, and a caption changed in any one attribute must fail.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "demo_checker.h"
#include "io/image.h"

namespace atelier {
namespace {

const std::filesystem::path kData = std::filesystem::path(ATELIER_TEST_SOURCE_DIR) / "tests" / "data" / "demo";

std::vector<std::pair<std::string, std::string>> captions() {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream in(kData / "captions.txt");
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) out.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return out;
}

Image load(const std::string& name) {
  auto img = read_image((kData / name).string());
  EXPECT_TRUE(img.has_value()) << name << ": " << img.status().message();
  return img.has_value() ? *img : Image{};
}

TEST(DemoChecker, ParsesTheCaptionGrammar) {
  const auto s = demo::parse_prompt("two small yellow stars on a purple background");
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(s.size, "small");
  EXPECT_EQ(s.colour, "yellow");
  EXPECT_EQ(s.shape, "star");
  EXPECT_EQ(s.background, "purple");
  EXPECT_EQ(s.position, "");
  const auto t = demo::parse_prompt("an orange circle on the left on a blue background");
  EXPECT_EQ(t.count, 1);
  EXPECT_EQ(t.size, "");
  EXPECT_EQ(t.colour, "orange");
  EXPECT_EQ(t.shape, "circle");
  EXPECT_EQ(t.position, "left");
  EXPECT_EQ(t.background, "blue");
}

TEST(DemoChecker, GeneratorImagesPass) {
  const auto caps = captions();
  ASSERT_GE(caps.size(), 10u) << "missing " << (kData / "captions.txt");
  for (const auto& [name, caption] : caps) {
    const auto r = demo::check(load(name), caption);
    EXPECT_TRUE(r.passed) << name << " '" << caption << "': found " << r.describe();
  }
}

// Each caption with one attribute swapped for another value of it must fail on the same image.
TEST(DemoChecker, WrongCaptionsFail) {
  const std::vector<std::pair<std::string, std::string>> swaps = {
      {" red ", " green "}, {" circle", " square"}, {"a large", "two large"}, {"large", "small"},
      {"blue background", "red background"}};
  const auto img = load("shapes_00.png");  // a large red circle on a blue background
  ASSERT_TRUE(demo::check(img, "a large red circle on a blue background").passed);
  for (const auto& [from, to] : swaps) {
    std::string cap = "a large red circle on a blue background";
    cap.replace(cap.find(from), from.size(), to);
    EXPECT_FALSE(demo::check(img, cap).passed) << cap;
  }
  for (const std::string shape : {"circle", "square", "triangle"})  // shapes_01: two small yellow stars
    EXPECT_FALSE(demo::check(load("shapes_01.png"), "two small yellow " + shape + "s on a purple background").passed) << shape;
  EXPECT_FALSE(demo::check(load("shapes_03.png"), "a small white square on the right on a black background").passed);
}

TEST(DemoChecker, PositionRegions) {
  EXPECT_TRUE(demo::position_matches("left", 0.2, 0.5));
  EXPECT_FALSE(demo::position_matches("left", 0.5, 0.5));
  EXPECT_TRUE(demo::position_matches("center", 0.55, 0.45));
  EXPECT_FALSE(demo::position_matches("center", 0.7, 0.5));
  EXPECT_TRUE(demo::position_matches("bottom", 0.5, 0.8));
}

}  // namespace
}  // namespace atelier
