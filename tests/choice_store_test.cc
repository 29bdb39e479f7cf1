// Per-shape choices kept across processes (backend/choice_store.h): what one store writes, another store of the
// same fingerprint (a later process) reads; other fingerprints, broken files and writers racing each other lose
// nothing but choices.
#include "backend/choice_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

TEST(ChoiceStore, ALaterStoreOfTheSameFingerprintReadsTheChoices) {
  TempDir dir;
  {
    ChoiceStore first(dir.path.string(), "card A; driver 1");
    EXPECT_FALSE(first.get("sdpa 1 2 3").has_value());
    EXPECT_TRUE(first.put("sdpa 1 2 3", -1));
    EXPECT_TRUE(first.put("sdpa 4 5 6", 17));
    EXPECT_EQ(first.get("sdpa 4 5 6"), 17);
  }
  ChoiceStore later(dir.path.string(), "card A; driver 1");
  EXPECT_EQ(later.get("sdpa 1 2 3"), -1);
  EXPECT_EQ(later.get("sdpa 4 5 6"), 17);
  EXPECT_FALSE(later.get("sdpa 7 8 9").has_value());
}

TEST(ChoiceStore, ChoicesOfAKindAreFoundByTheirKeysPrefix) {
  TempDir dir;
  {
    ChoiceStore first(dir.path.string(), "fp");
    for (const auto& [key, value] : {std::pair<const char*, int64_t>{"cudnn conv [2,320]", 7}, {"cudnn conu", 1},
                                     {"cudnn conv [1,4]", -1}, {"gemm [1]", 3}, {"cudnn con", 2}})
      ASSERT_TRUE(first.put(key, value));
  }
  const ChoiceStore later(dir.path.string(), "fp");
  using Entries = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(later.with_prefix("cudnn conv"), (Entries{{"cudnn conv [1,4]", -1}, {"cudnn conv [2,320]", 7}}));
  EXPECT_EQ(later.with_prefix("gemm"), (Entries{{"gemm [1]", 3}}));
  EXPECT_TRUE(later.with_prefix("sdpa").empty());
  EXPECT_EQ(later.with_prefix("").size(), 5u);
}

TEST(ChoiceStore, AnotherFingerprintSeesNoneOfThem) {
  TempDir dir;
  ChoiceStore a(dir.path.string(), "card A; driver 1");
  ASSERT_TRUE(a.put("k", 3));
  ChoiceStore b(dir.path.string(), "card A; driver 2");
  EXPECT_FALSE(b.get("k").has_value());
  EXPECT_NE(a.path(), b.path());
  ASSERT_TRUE(b.put("k", 5));  // beside a's file, not over it
  EXPECT_EQ(ChoiceStore(dir.path.string(), "card A; driver 1").get("k"), 3);
}

TEST(ChoiceStore, ABrokenFileIsIgnoredAndReplaced) {
  TempDir dir;
  const std::string path = ChoiceStore(dir.path.string(), "fp").path();
  fs::create_directories(dir.path);
  for (const char* bad : {"{not json", "[1, 2]", R"({"version": 1, "fingerprint": "other", "choices": {"k": 1}})",
                          R"({"version": 99, "fingerprint": "fp", "choices": {"k": 1}})"}) {
    std::ofstream(path, std::ios::trunc) << bad;
    ChoiceStore s(dir.path.string(), "fp");
    EXPECT_FALSE(s.get("k").has_value()) << bad;
    ASSERT_TRUE(s.put("j", 2)) << bad;
    EXPECT_EQ(ChoiceStore(dir.path.string(), "fp").get("j"), 2) << bad;
  }
}

// Two processes planning at once: each writes what it chose, and neither loses the other's choices.
TEST(ChoiceStore, WritersMergeWhatOthersWroteSince) {
  TempDir dir;
  ChoiceStore one(dir.path.string(), "fp"), two(dir.path.string(), "fp");
  ASSERT_TRUE(one.put("a", 1));
  ASSERT_TRUE(two.put("b", 2));
  ASSERT_TRUE(one.put("c", 3));
  ChoiceStore later(dir.path.string(), "fp");
  EXPECT_EQ(later.get("a"), 1);
  EXPECT_EQ(later.get("b"), 2);
  EXPECT_EQ(later.get("c"), 3);
}

// Two stores of one file in one process (two GPUs of the same kind: one backend and store each) writing at once:
// every write leaves a whole file that parses, so a later store reads the choices instead of discarding a torn file.
TEST(ChoiceStore, StoresOfOneFileInOneProcessWriteWholeFiles) {
  TempDir dir;
  constexpr int kPuts = 300;
  ChoiceStore a(dir.path.string(), "card A; driver 1"), b(dir.path.string(), "card A; driver 1");
  std::atomic<bool> done{false};
  int torn = 0, reads = 0;
  std::thread reader([&] {  // what a third process reading the file meanwhile sees
    while (!done) {
      std::ifstream in(a.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.empty()) continue;
      ++reads;
      torn += !nlohmann::json::accept(text);
    }
  });
  std::thread ta([&] { for (int i = 0; i < kPuts; ++i) a.put("a " + std::to_string(i), i); });
  std::thread tb([&] { for (int i = 0; i < kPuts; ++i) b.put("b " + std::to_string(i), i); });
  ta.join();
  tb.join();
  done = true;
  reader.join();
  EXPECT_EQ(torn, 0) << "of " << reads << " reads of the file while both wrote";
  // The last writer's file holds at least its own choices (racing merges may drop some of the other's).
  ChoiceStore later(dir.path.string(), "card A; driver 1");
  const bool a_whole = later.get("a " + std::to_string(kPuts - 1)) == kPuts - 1;
  const bool b_whole = later.get("b " + std::to_string(kPuts - 1)) == kPuts - 1;
  EXPECT_TRUE(a_whole || b_whole) << "the file no longer parses: a write was torn by the other store's";
  int left = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) left += entry.path().extension() != ".json";
  EXPECT_EQ(left, 0) << "a temporary file was left behind";
}

// Keys from shapes: parts separated by spaces, sequences bracketed, so that different shapes never share a key.
TEST(ChoiceStore, TextsAreKeptBesideTheChoicesForTheirKeyAndFingerprintOnly) {
  TempDir dir;
  const std::string plan = std::string("{\"engine\": 5,\n \"kernel\": \"") + std::string(3 << 20, 'k') + "\"}";  // MBs, newlines
  {
    ChoiceStore first(dir.path.string(), "card A; cudnn 9");
    EXPECT_FALSE(first.get_text("sdpa [2,8] plan 5").has_value());
    ASSERT_TRUE(first.put_text("sdpa [2,8] plan 5", plan));
    ASSERT_TRUE(first.put_text("sdpa [2,9] plan 5", ""));
  }
  ChoiceStore later(dir.path.string(), "card A; cudnn 9");
  EXPECT_EQ(later.get_text("sdpa [2,8] plan 5"), plan);
  EXPECT_EQ(later.get_text("sdpa [2,9] plan 5"), "");
  EXPECT_FALSE(later.get_text("sdpa [2,8] plan 6").has_value()) << "a text of another answer";
  EXPECT_FALSE(ChoiceStore(dir.path.string(), "card B; cudnn 9").get_text("sdpa [2,8] plan 5").has_value());
  EXPECT_FALSE(later.put_text("two\nlines", "x")) << "a key is one line of the text's file";
  EXPECT_TRUE(later.get("sdpa [2,8] plan 5") == std::nullopt) << "texts are not choices";

  // A file whose first line names another key (two keys of one hash) gives its text to that key only.
  fs::path file;
  for (const auto& e : fs::recursive_directory_iterator(dir.path))
    if (e.is_regular_file() && e.path().extension() == ".txt" && fs::file_size(e.path()) > 1000) file = e.path();
  ASSERT_FALSE(file.empty());
  std::ofstream(file, std::ios::trunc) << "sdpa [7,7] plan 5\n" << plan;
  EXPECT_FALSE(later.get_text("sdpa [2,8] plan 5").has_value());

  ChoiceStore off("", "card A; cudnn 9");
  EXPECT_FALSE(off.put_text("k", "x"));
  EXPECT_FALSE(off.get_text("k").has_value());
}

TEST(ChoiceStore, ANewStoreRemovesStoresUnusedForAMonthAndKeepsTheOthers) {
  TempDir dir;
  const auto age = [](const std::string& path, int days) {
    fs::last_write_time(path, fs::file_time_type::clock::now() - std::chrono::hours(24 * days));
  };
  ChoiceStore old_binary(dir.path.string(), "card A; binary 1");
  ASSERT_TRUE(old_binary.put("k", 1));
  ASSERT_TRUE(old_binary.put_text("k plan 1", "serialized"));
  ChoiceStore recent(dir.path.string(), "card B; binary 1");
  ASSERT_TRUE(recent.put("k", 2));
  age(old_binary.path(), 40);
  age(recent.path(), 20);
  std::ofstream(dir.path / "notes.txt") << "not a store";
  age((dir.path / "notes.txt").string(), 400);

  ChoiceStore current(dir.path.string(), "card A; binary 2");
  EXPECT_TRUE(fs::exists(old_binary.path())) << "nothing is removed before the new store writes its file";
  ASSERT_TRUE(current.put("k", 3));
  EXPECT_FALSE(fs::exists(old_binary.path()));
  EXPECT_FALSE(fs::exists(fs::path(old_binary.path()).replace_extension(".texts"))) << "the old store's texts go with it";
  EXPECT_TRUE(fs::exists(recent.path()));
  EXPECT_TRUE(fs::exists(dir.path / "notes.txt")) << "only stores are removed";
  EXPECT_EQ(ChoiceStore(dir.path.string(), "card B; binary 1").get("k"), 2);

  // Opening a store marks it as in use: a month-old store opened today is not removed by the next new one.
  age(recent.path(), 40);
  ChoiceStore reopened(dir.path.string(), "card B; binary 1");
  ChoiceStore another(dir.path.string(), "card A; binary 3");
  ASSERT_TRUE(another.put("k", 4));
  EXPECT_TRUE(fs::exists(recent.path()));
}

TEST(ChoiceStore, KeysSpellTheirPartsUnambiguously) {
  const std::vector<int64_t> a{1, 2}, b{3}, c{1}, d{2, 3};
  EXPECT_EQ(choice_key("conv path", std::make_tuple(a, 7, true, std::string("x y")), "of", size_t(3)),
            "conv path [1,2] 7 1 x y of 3");
  EXPECT_EQ(choice_key("sdpa", std::array<int64_t, 3>{2, 8, 40}), "sdpa [2,8,40]");
  EXPECT_NE(choice_key(a, b), choice_key(c, d));
  EXPECT_EQ(choice_key(), "");
}

TEST(ChoiceStore, EmptyFolderKeepsNothingAndTheEnvironmentChoosesTheFolder) {
  ChoiceStore off("", "fp");
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.put("k", 1));
  EXPECT_EQ(off.get("k"), 1);  // still this process's choice

  const char* saved = std::getenv("ATELIER_PLAN_CACHE");
  const std::string restore = saved ? saved : "";
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string restore_xdg = saved_xdg ? saved_xdg : "";
  setenv("ATELIER_PLAN_CACHE", "0", 1);
  EXPECT_EQ(ChoiceStore::default_dir(), "");
  setenv("ATELIER_PLAN_CACHE", "/some/dir", 1);
  EXPECT_EQ(ChoiceStore::default_dir(), "/some/dir");
  unsetenv("ATELIER_PLAN_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(ChoiceStore::default_dir(), "/xdg/atelier");
  unsetenv("XDG_CACHE_HOME");
  if (saved) setenv("ATELIER_PLAN_CACHE", restore.c_str(), 1);
  if (saved_xdg) setenv("XDG_CACHE_HOME", restore_xdg.c_str(), 1);
  EXPECT_FALSE(ChoiceStore::executable_identity().empty());
}

}  // namespace
}  // namespace atelier
