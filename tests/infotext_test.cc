// A1111 infotext: exact output format, quoting, parsing of A1111-written text, and round trips.
#include "io/infotext.h"

#include <gtest/gtest.h>

#include <random>

namespace atelier {
namespace {

TEST(Infotext, BuildsA1111Layout) {
  const std::string t = build_infotext("a photo of a cat, (masterpiece:1.2)", "blurry, lowres",
                                       {{"Steps", "20"}, {"Sampler", "Euler a"}, {"CFG scale", "7"},
                                        {"Seed", "1234"}, {"Size", "512x512"}, {"Model hash", "6ce0161689"}});
  EXPECT_EQ(t,
            "a photo of a cat, (masterpiece:1.2)\n"
            "Negative prompt: blurry, lowres\n"
            "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1234, Size: 512x512, Model hash: 6ce0161689");
  // No negative prompt: the line is left out.
  EXPECT_EQ(build_infotext("cat", "", {{"Steps", "20"}}), "cat\nSteps: 20");
  // Empty prompt: stripped like A1111's .strip().
  EXPECT_EQ(build_infotext("", "", {{"Steps", "20"}}), "Steps: 20");
}

TEST(Infotext, QuotesValuesLikeA1111) {
  EXPECT_EQ(quote_infotext_value("Euler a"), "Euler a");
  EXPECT_EQ(quote_infotext_value("a, b"), "\"a, b\"");
  EXPECT_EQ(quote_infotext_value("lora: 0.8"), "\"lora: 0.8\"");
  EXPECT_EQ(quote_infotext_value("line1\nline2"), "\"line1\\nline2\"");
  EXPECT_EQ(quote_infotext_value("say \"hi\", ok"), "\"say \\\"hi\\\", ok\"");
  EXPECT_EQ(quote_infotext_value("\xe7\x8c\xab, \xe7\x8a\xac"), "\"\xe7\x8c\xab, \xe7\x8a\xac\"");  // UTF-8 kept raw
  EXPECT_EQ(quote_infotext_value("\"quoted\""), "\"\\\"quoted\\\"\"");  // would otherwise be unquoted on read
}

TEST(Infotext, ParsesA1111Text) {
  const std::string text =
      "masterpiece, 1girl,\n"
      "  second prompt line  \n"
      "Negative prompt: (worst quality:1.4),\n"
      "bad hands\n"
      "Steps: 28, Sampler: DPM++ 2M Karras, CFG scale: 7.5, Seed: 42, Size: 512x768, "
      "Lora hashes: \"add_detail: 7c6bad76eb54, more_details: 3b8aa1d351ef\", Version: v1.6.0";
  const Infotext info = parse_infotext(text);
  EXPECT_EQ(info.prompt, "masterpiece, 1girl,\nsecond prompt line");
  EXPECT_EQ(info.negative, "(worst quality:1.4),\nbad hands");
  ASSERT_EQ(info.params.size(), 7u);
  EXPECT_EQ(info.get("Sampler"), "DPM++ 2M Karras");
  EXPECT_EQ(info.get("Size"), "512x768");
  EXPECT_EQ(info.get("Lora hashes"), "add_detail: 7c6bad76eb54, more_details: 3b8aa1d351ef");
  EXPECT_EQ(info.get("Version"), "v1.6.0");
  EXPECT_EQ(info.get("Missing", "d"), "d");
}

TEST(Infotext, LastLineWithFewerThanThreeParamsIsPrompt) {
  const Infotext info = parse_infotext("a cat\nStyle: photo, Light: soft");
  EXPECT_EQ(info.prompt, "a cat\nStyle: photo, Light: soft");
  EXPECT_TRUE(info.params.empty());
  const Infotext only_prompt = parse_infotext("just a prompt");
  EXPECT_EQ(only_prompt.prompt, "just a prompt");
  EXPECT_EQ(parse_infotext("").prompt, "");
}

TEST(Infotext, RoundTrips) {
  struct Case {
    std::string prompt, negative;
    InfotextParams params;
  };
  const std::vector<Case> cases = {
      {"a cat", "", {{"Steps", "20"}, {"Sampler", "Euler"}, {"Seed", "1"}}},
      {"line one,\nline two: (x:1.2)", "neg\nmore neg", {{"Steps", "6"}, {"CFG scale", "7.5"}, {"Size", "128x128"}}},
      {"\xe7\x8c\xab \xf0\x9f\x90\xb1", "\xc3\xa9t\xc3\xa9",
       {{"Steps", "20"}, {"Prompt note", "a, b: c\nd"}, {"Quote", "\"x\""}, {"Backslash", "c:\\dir\\f"},
        {"Empty", ""}, {"Spaces", " padded "}, {"Model", "sd15-tiny"}}},
      {"prompt mentioning Negative prompt: inside", "", {{"Aa", "1"}, {"Bb", "2"}, {"Cc", "3"}}},
  };
  for (const Case& c : cases) {
    const std::string text = build_infotext(c.prompt, c.negative, c.params);
    const Infotext back = parse_infotext(text);
    EXPECT_EQ(back.prompt, c.prompt) << text;
    EXPECT_EQ(back.negative, c.negative) << text;
    EXPECT_EQ(back.params, c.params) << text;
  }
}

TEST(Infotext, ParserSurvivesRandomText) {
  // Strings over the characters the grammar cares about; parsing must terminate and never throw.
  const std::string alphabet = "ab :,\"\\\n -/_\xc3\xa9";
  std::mt19937 rng(5);
  for (int k = 0; k < 500; ++k) {
    std::string s(rng() % 80, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    const Infotext info = parse_infotext(s);
    for (const auto& [key, value] : info.params) EXPECT_GE(key.size(), 2u) << s;
    (void)build_infotext(info.prompt, info.negative, info.params);
  }
}

}  // namespace
}  // namespace atelier
