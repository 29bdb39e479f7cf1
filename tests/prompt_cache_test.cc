// The server worker's prompt cache: a prompt is encoded once per model, clip skip and emphasis; a model that
// was unloaded never gets another model's (or its own stale) encodings; least recently used entries go first;
// failures are not cached; encodings put in by a batched prefetch are hits.
#include <gtest/gtest.h>

#include "pipeline/sd_model.h"
#include "serve/prompt_cache.h"

namespace atelier::serve {
namespace {

// An "encoder" that counts its calls and returns a tensor tagged with the call number.
struct CountingEncoder {
  int calls = 0;
  PromptCache::Encode fn() {
    return [this]() -> Expected<Tensor> { return Tensor::full({1, 2, 3}, float(++calls)); };
  }
};

float tag(const Expected<Tensor>& t) { return t->to_vector().at(0); }

TEST(PromptCache, EncodesEachPromptOncePerModelAndSettings) {
  PromptCache cache;
  CountingEncoder enc;
  auto a = std::make_shared<SdModel>(), b = std::make_shared<SdModel>();
  EXPECT_EQ(tag(cache.get(a, "blurry", 1, true, enc.fn())), 1.0f);
  EXPECT_EQ(tag(cache.get(a, "blurry", 1, true, enc.fn())), 1.0f);  // hit
  EXPECT_EQ(tag(cache.get(a, "blurry", 2, true, enc.fn())), 2.0f);  // other clip skip
  EXPECT_EQ(tag(cache.get(a, "blurry", 1, false, enc.fn())), 3.0f); // no emphasis
  EXPECT_EQ(tag(cache.get(a, "sharp", 1, true, enc.fn())), 4.0f);   // other text
  EXPECT_EQ(tag(cache.get(b, "blurry", 1, true, enc.fn())), 5.0f);  // other model
  EXPECT_EQ(tag(cache.get(a, "blurry", 2, true, enc.fn())), 2.0f);
  EXPECT_EQ(enc.calls, 5);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 5u);
}

TEST(PromptCache, AnUnloadedModelsEntriesAreDropped) {
  PromptCache cache;
  CountingEncoder enc;
  auto a = std::make_shared<SdModel>();
  EXPECT_EQ(tag(cache.get(a, "x", 1, true, enc.fn())), 1.0f);
  EXPECT_EQ(tag(cache.get(a, "y", 1, true, enc.fn())), 2.0f);
  EXPECT_EQ(cache.size(), 2u);
  a.reset();  // evicted from the worker: a model loaded later may even reuse the address
  auto again = std::make_shared<SdModel>();
  EXPECT_EQ(tag(cache.get(again, "x", 1, true, enc.fn())), 3.0f);  // encoded anew, never the stale entry
  EXPECT_EQ(cache.size(), 1u);
}

TEST(PromptCache, LeastRecentlyUsedEntriesGoFirst) {
  PromptCache cache(2);
  CountingEncoder enc;
  auto m = std::make_shared<SdModel>();
  EXPECT_EQ(tag(cache.get(m, "a", 1, true, enc.fn())), 1.0f);
  EXPECT_EQ(tag(cache.get(m, "b", 1, true, enc.fn())), 2.0f);
  EXPECT_EQ(tag(cache.get(m, "a", 1, true, enc.fn())), 1.0f);  // hit: "b" is now the oldest
  EXPECT_EQ(tag(cache.get(m, "c", 1, true, enc.fn())), 3.0f);  // evicts "b"
  EXPECT_EQ(tag(cache.get(m, "a", 1, true, enc.fn())), 1.0f);
  EXPECT_EQ(tag(cache.get(m, "b", 1, true, enc.fn())), 4.0f);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PromptCache, FailuresAreNotCached) {
  PromptCache cache;
  auto m = std::make_shared<SdModel>();
  int calls = 0;
  auto failing = [&]() -> Expected<Tensor> {
    ++calls;
    return invalid_argument("clip skip 9 is more than this text encoder allows");
  };
  EXPECT_FALSE(cache.get(m, "p", 9, true, failing).has_value());
  EXPECT_FALSE(cache.get(m, "p", 9, true, failing).has_value());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.size(), 0u);
}

// The worker's batched prefetch puts encodings in; admissions then hit them without encoding.
TEST(PromptCache, PutEntriesAreHitsAndFollowTheSameRules) {
  PromptCache cache(2);
  CountingEncoder enc;
  auto m = std::make_shared<SdModel>();
  EXPECT_FALSE(cache.contains(m, "a", 1, true));
  cache.put(m, "a", 1, true, Tensor::full({1, 2, 3}, 7.0f));
  EXPECT_TRUE(cache.contains(m, "a", 1, true));
  EXPECT_FALSE(cache.contains(m, "a", 2, true));
  EXPECT_EQ(cache.hits(), 0u);  // contains() is not a hit
  EXPECT_EQ(tag(cache.get(m, "a", 1, true, enc.fn())), 7.0f);
  EXPECT_EQ(enc.calls, 0);
  cache.put(m, "a", 1, true, Tensor::full({1, 2, 3}, 8.0f));  // replaces, no duplicate
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(tag(cache.get(m, "a", 1, true, enc.fn())), 8.0f);
  cache.put(m, "b", 1, true, Tensor::full({1, 2, 3}, 9.0f));
  cache.put(m, "c", 1, true, Tensor::full({1, 2, 3}, 10.0f));  // capacity 2: "a" (least recent) goes
  EXPECT_FALSE(cache.contains(m, "a", 1, true));
  EXPECT_TRUE(cache.contains(m, "b", 1, true) && cache.contains(m, "c", 1, true));
  m.reset();  // unloaded: its entries are never returned
  auto other = std::make_shared<SdModel>();
  EXPECT_FALSE(cache.contains(other, "b", 1, true));
}

}  // namespace
}  // namespace atelier::serve
