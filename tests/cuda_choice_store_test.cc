// Choices kept across processes (backend/choice_store.h) by TimedChoice (cuda_event_timing.h), cuBLASLt's
// algorithm per product (GemmEngine), cuDNN's convolution plans (ConvGraph) and its SDPA plans (CudnnSdpa): the
// first process times its candidates and keeps the answer; a later one (new engines on a new store of the same
// file) takes it without timing anything and computes the same result; a different candidate list, or an answer
// that names no candidate, is timed afresh. Skips without a GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "backend/choice_store.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_conv_graph.h"
#include "backend/cuda/cuda_event_timing.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_sdpa.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using Key = std::tuple<std::vector<int64_t>, int, bool, std::string>;

constexpr size_t kSlowBytes = size_t(256) << 20;  // a memset that takes ~0.1 ms on any card
constexpr size_t kFastBytes = 256;

TEST(CudaTimedChoice, ALaterProcessTakesTheKeptAnswerWithoutTiming) {
  ATELIER_REQUIRE_CUDA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kSlowBytes), cudaSuccess);
  int runs[3] = {0, 0, 0};
  const auto memset_of = [&](int which, size_t bytes) -> std::function<bool()> {
    return [&, which, bytes] {
      ++runs[which];
      return cudaMemsetAsync(buf, which, bytes, stream) == cudaSuccess;
    };
  };
  const std::vector<std::function<bool()>> two = {memset_of(0, kSlowBytes), memset_of(1, kFastBytes)};
  const Key key{{2, 4096, 320}, 7, true, "slow fast"};
  test::TempDir dir;

  ChoiceStore first_store(dir.path.string(), "card; driver; binary");
  cuda::TimedChoice<Key> first;
  first.keep_in(&first_store, "test memset");
  EXPECT_EQ(first.fastest(key, stream, two), 1);
  EXPECT_GT(runs[0], 0);
  EXPECT_GT(runs[1], 0);

  runs[0] = runs[1] = 0;
  ChoiceStore later_store(dir.path.string(), "card; driver; binary");  // what a later process opens
  cuda::TimedChoice<Key> later;
  later.keep_in(&later_store, "test memset");
  EXPECT_EQ(later.fastest(key, stream, two), 1);
  EXPECT_EQ(runs[0] + runs[1], 0) << "a kept answer was timed again";

  // Three candidates are another question: timed, and kept beside the first answer.
  const std::vector<std::function<bool()>> three = {memset_of(0, kSlowBytes), memset_of(1, kSlowBytes / 2),
                                                    memset_of(2, kFastBytes)};
  cuda::TimedChoice<Key> other;
  other.keep_in(&later_store, "test memset");
  EXPECT_EQ(other.fastest(key, stream, three), 2);
  EXPECT_GT(runs[2], 0);
  // Without a store nothing is kept: a new TimedChoice times again.
  runs[0] = runs[1] = 0;
  cuda::TimedChoice<Key> unkept;
  EXPECT_EQ(unkept.fastest(key, stream, two), 1);
  EXPECT_GT(runs[0] + runs[1], 0);

  cudaFree(buf);
  cudaStreamDestroy(stream);
}


// y as host f32 values (y on cuda:0, after the stream's work).
std::vector<float> host_values(const Tensor& y) {
  EXPECT_EQ(cudaStreamSynchronize(test::cuda_be().stream()), cudaSuccess);
  const Tensor h = ops::cast(ops::to_device(y, Device::cpu()), DType::F32);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// Rewrites every answer kept in the store files of `dir` to `value` (an answer that names no candidate).
void overwrite_answers(const std::filesystem::path& dir, int64_t value) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".json") continue;  // the serialized plans' folder
    std::ifstream in(entry.path());
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& [key, answer] : j["choices"].items()) answer = value;
    std::ofstream(entry.path()) << j.dump();
  }
}

// The serialized plans kept in the store folder `dir` (files of the .texts folders), and their removal.
int kept_plan_texts(const std::filesystem::path& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.path().extension() == ".txt";
  return n;
}
void remove_plan_texts(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> texts;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().extension() == ".txt") texts.push_back(e.path());
  for (const auto& t : texts) std::filesystem::remove(t);
}

// What each engine test starts from: cuda:0's stream, an allocator on it, an empty store folder, and the stores
// that one process after another opens there.
class CudaKeptChoices : public ::testing::Test {
 public:  // check_a_kept_plan_is_taken runs processes on them
  void SetUp() override {
    ATELIER_REQUIRE_CUDA();
    stream = test::cuda_be().stream();
    alloc = std::make_unique<cuda::DeviceAllocator>(0, stream);
  }
  // What the next process opens.
  ChoiceStore* next_store() {
    stores_.push_back(std::make_unique<ChoiceStore>(dir.path.string(), "card; driver; cudnn; cublasLt; binary"));
    return stores_.back().get();
  }
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::DeviceAllocator> alloc;
  test::TempDir dir;

 private:
  std::vector<std::unique_ptr<ChoiceStore>> stores_;
};

// C [m, n] += A [m, k] B[n, k]^T in bf16 with f32 accumulation (a residual product: timed from 1 GFLOP on).
struct ResidualProduct {
  static constexpr int64_t kM = 1024, kN = 1024, kK = 1024;  // 2.1 GFLOP
  Tensor a = test::to_gpu(test::random_tensor({kM, kK}, 11), DType::BF16);
  Tensor b = test::to_gpu(test::random_tensor({kN, kK}, 12, 1.0f / 32), DType::BF16);
  // Runs the product on `engine` into a new C of the same values each time; C's values after it.
  std::vector<float> run(cuda::GemmEngine& engine) const {
    const Tensor c = test::to_gpu(test::random_tensor({kM, kN}, 13), DType::BF16);
    cuda::GemmCall call;
    call.m = kM, call.n = kN, call.k = kK;
    call.a = {a.raw(), DType::BF16, kK, 0, false};
    call.b = {b.raw(), DType::BF16, kK, 0, true};
    call.c = c.raw(), call.c_dtype = DType::BF16, call.ldc = kN, call.beta = 1.0f;
    EXPECT_EQ(cudaStreamSynchronize(test::cuda_be().stream()), cudaSuccess);
    engine.run(call, false);
    return host_values(c);
  }
};

TEST_F(CudaKeptChoices, ALaterProcessTakesTheKeptGemmAlgorithmWithoutTiming) {
  const ResidualProduct product;
  cuda::GemmEngine first(0, stream, *alloc);
  first.keep_choices_in(next_store());
  EXPECT_TRUE(first.warm_up()) << "cuBLASLt's warm-up product failed";
  EXPECT_EQ(first.tune_counts().timed, 0) << "the warm-up product was timed as a shape";
  const std::vector<float> want = product.run(first);
  ASSERT_EQ(first.tune_counts().timed, 1) << "a 2.1 GFLOP residual product is timed at its first call";
  EXPECT_EQ(first.tune_counts().from_store, 0);

  cuda::GemmEngine later(0, stream, *alloc);
  later.keep_choices_in(next_store());
  const std::vector<float> got = product.run(later);
  EXPECT_EQ(later.tune_counts().timed, 0) << "a kept answer was timed again";
  EXPECT_EQ(later.tune_counts().from_store, 1);
  EXPECT_EQ(got, want) << "the kept algorithm computed other bits than the one the first process chose";

  // An answer that names none of today's candidates is ignored: the shape is timed afresh.
  overwrite_answers(dir.path, 1000);
  cuda::GemmEngine stale(0, stream, *alloc);
  stale.keep_choices_in(next_store());
  product.run(stale);
  EXPECT_EQ(stale.tune_counts().timed, 1);
  EXPECT_EQ(stale.tune_counts().from_store, 0);
}

// A channels-last 3x3 convolution at an SD shape (cuDNN offers several plans for it) on a ConvEngine of its own.
struct SdConvolution {
  static constexpr int64_t kN = 2, kC = 320, kH = 32, kW = 32;
  const cuda::ConvShape shape{kN, kC, kH, kW, kC, 3, 3, kH, kW};
  const Conv2dParams params{1, 1, 1, 1, 1, 1, 1};
  Tensor x = test::to_gpu(test::random_tensor({kN, kH, kW, kC}, 21), DType::BF16);                  // NHWC
  Tensor w = test::to_gpu(test::random_tensor({kC, 3, 3, kC}, 22, 1.0f / 54), DType::BF16);         // [O, kh, kw, C]
  Tensor bias = test::to_gpu(test::random_tensor({kC}, 23), DType::BF16);  // a bias alone: precompiled engines fuse it
  Tensor empty_y() const { return Tensor::empty({kN, kH, kW, kC}, DType::BF16, test::cuda0()); }
};

bool graph_api_ready(const cuda::ConvEngine& engine) {
  return engine.available() && cuda::conv_graph_enabled() && cuda::conv_graph_autotune() &&
         engine.version().find("(graph API") != std::string::npos;
}

// What one process's planning of a shape did, by a plan engine's counters: plans made afresh, plans taken from the
// store (and of those, restored from their serialized form), shapes whose candidates were timed.
struct KeptCounts {
  int64_t fresh = 0, from_store = 0, deserialized = 0, timed = 0;
  KeptCounts operator-(const KeptCounts& o) const {
    return {fresh - o.fresh, from_store - o.from_store, deserialized - o.deserialized, timed - o.timed};
  }
};

// A kept cuDNN plan over four processes, each a new engine on the next store: `process(store)` makes it, runs the
// shape and returns the output's values; `counts()` reads the engine kind's counters. The first process plans the
// shape afresh and keeps its plan (and the plan's text, where cuDNN serializes it); a later one restores that plan,
// times nothing and computes the same bits; without the text it finalizes the kept configuration alone, still
// untimed; a kept answer that names no configuration the heuristics offer is planned afresh. `after_first(texts)`
// runs between the first process and the later ones.
void check_a_kept_plan_is_taken(CudaKeptChoices& t, const char* what, const std::function<std::vector<float>(ChoiceStore*)>& process,
                                const std::function<KeptCounts()>& counts, const std::function<void(int texts)>& after_first = {}) {
  KeptCounts before = counts();
  const std::vector<float> want = process(t.next_store());
  KeptCounts d = counts() - before;
  ASSERT_EQ(d.fresh, 1);
  EXPECT_EQ(d.from_store, 0);
  const int texts = kept_plan_texts(t.dir.path);
  std::printf("[ %-8s ] first process: %lld shape(s) timed, %d serialized plan(s) kept\n", what, (long long)d.timed, texts);
  if (after_first) after_first(texts);

  before = counts();
  const std::vector<float> got = process(t.next_store());
  d = counts() - before;
  EXPECT_EQ(d.fresh, 0);
  EXPECT_EQ(d.from_store, 1);
  EXPECT_EQ(d.deserialized, texts) << "a kept serialized plan was not restored";
  EXPECT_EQ(d.timed, 0) << "a kept plan was timed again";
  EXPECT_EQ(got, want) << "the kept plan computed other bits than the one the first process chose";

  remove_plan_texts(t.dir.path);
  before = counts();
  EXPECT_EQ(process(t.next_store()), want);
  d = counts() - before;
  EXPECT_EQ(d.from_store, 1);
  EXPECT_EQ(d.deserialized, 0);
  EXPECT_EQ(d.timed, 0);

  overwrite_answers(t.dir.path, int64_t(1) << 40);
  before = counts();
  EXPECT_EQ(process(t.next_store()), want);
  d = counts() - before;
  EXPECT_EQ(d.from_store, 0);
  EXPECT_EQ(d.fresh, 1);
}

TEST_F(CudaKeptChoices, ALaterProcessTakesTheKeptConvolutionPlanWithoutTiming) {
  if (cuda::ConvEngine probe(0, stream); !graph_api_ready(probe)) GTEST_SKIP() << "cuDNN's graph API is not in use: " << probe.version();
  const SdConvolution conv;
  const auto process = [&](ChoiceStore* store) {
    cuda::ConvEngine engine(0, stream);
    engine.keep_choices_in(store);
    Tensor y = conv.empty_y();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(engine.forward(y.raw(), conv.x.raw(), conv.w.raw(), DType::BF16, conv.shape, conv.params, false, *alloc, true));
    return host_values(y);
  };
  const auto counts = [] {
    const cuda::ConvGraphStats s = cuda::conv_graph_stats();
    return KeptCounts{s.plans - s.from_store, s.from_store, s.deserialized, s.autotuned};
  };
  // The start-up thread's warm-up restores one kept plan on a handle of its own; with nothing kept it restores none.
  const auto warm_up = [&](int texts) {
    cuda::ConvEngine warm(0, stream);
    warm.keep_choices_in(next_store());
    EXPECT_EQ(warm.warm_up(), texts > 0);
    cuda::ConvEngine unkept(0, stream);
    EXPECT_FALSE(unkept.warm_up()) << "an engine without a store restored a plan";
  };
  check_a_kept_plan_is_taken(*this, "conv", process, counts, warm_up);
}

// cuDNN's SDPA plan for an SD self-attention shape, against a stand-in for our kernel that is far slower (a long
// memset), so that cuDNN's plan is chosen and kept.
TEST_F(CudaKeptChoices, ALaterProcessTakesTheKeptAttentionPlanWithoutTiming) {
  constexpr int64_t kB = 2, kH = 8, kS = 1024, kD = 64;
  const Tensor q = test::to_gpu(test::random_tensor({kB, kH, kS, kD}, 31), DType::BF16);
  const Tensor k = test::to_gpu(test::random_tensor({kB, kH, kS, kD}, 32), DType::BF16);
  const Tensor v = test::to_gpu(test::random_tensor({kB, kH, kS, kD}, 33), DType::BF16);
  std::shared_ptr<Buffer> slow = alloc->allocate(kSlowBytes);
  const std::function<bool()> ours = [&] { return cudaMemsetAsync(slow->data(), 0, kSlowBytes, stream) == cudaSuccess; };
  const cuda::ConvEngine conv(0, stream);  // cuDNN's library, and a handle on the stream
  if (cuda::CudnnSdpa probe(conv.library(), conv.handle(), stream, nullptr); !probe.available())
    GTEST_SKIP() << "cuDNN's SDPA node is not available here: " << probe.why_unavailable();
  const auto process = [&](ChoiceStore* store) {
    cuda::CudnnSdpa sdpa(conv.library(), conv.handle(), stream, store);
    Tensor out = Tensor::empty({kB, kH, kS, kD}, DType::BF16, test::cuda0());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(sdpa.forward(out, q, k, v, 0.125f, *alloc, ours)) << "cuDNN's plan lost to a 256 MiB memset";
    return host_values(out);
  };
  const auto counts = [] {
    const cuda::SdpaStats s = cuda::sdpa_stats();
    return KeptCounts{s.timed, s.from_store, s.deserialized, s.timed};
  };
  check_a_kept_plan_is_taken(*this, "sdpa", process, counts);
}

// The fused epilogue's verdict (kept, or the separate pass) is kept too: a later process that finds "not fused"
// builds no fused plan and runs neither the comparison nor the check; one that finds a kept fused plan times
// nothing but still checks the plan's result once.
class CudaKeptFusedVerdict : public CudaKeptChoices {
 protected:
  // agree: whether the result check passes (else the first process refuses the fusion).
  void check_a_later_process_keeps_the_verdict(bool agree) {
    const SdConvolution conv;
    const size_t y_bytes = conv.empty_y().nbytes();
    std::shared_ptr<Buffer> slow = alloc->allocate(size_t(256) << 20);  // the separate pass's stand-in: a long memset
    int separate_calls = 0, checks = 0;
    const auto fused_run = [&](cuda::ConvEngine& engine) {
      Tensor y = conv.empty_y();
      cuda::ConvEpilogue e;
      e.bias = conv.bias.raw();
      e.bias_dtype = DType::BF16;
      // A separate pass slower than any fused kernel, so that a fused plan that agrees is kept by measure.
      e.separate = [&] { ++separate_calls, cudaMemsetAsync(slow->data(), 0, slow->bytes(), stream); };
      // The check: fused = plain + bias to rounding (y holds the plain plan's output here), or a refusal.
      e.agrees = [&](const void* fused_y) {
        ++checks;
        if (!agree) return false;
        std::vector<uint16_t> f(y_bytes / 2), plain(y_bytes / 2);
        cudaStreamSynchronize(stream);
        cudaMemcpy(f.data(), fused_y, y_bytes, cudaMemcpyDeviceToHost);
        cudaMemcpy(plain.data(), y.raw(), y_bytes, cudaMemcpyDeviceToHost);
        const std::vector<float> bias = host_values(conv.bias);  // y is NHWC: channel i % C
        for (size_t i = 0; i < f.size(); ++i)
          if (std::fabs(bf16_to_float(f[i]) - (bf16_to_float(plain[i]) + bias[i % bias.size()])) > 0.05f) return false;
        return true;
      };
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      return engine.forward_fused(y.raw(), conv.x.raw(), conv.w.raw(), DType::BF16, conv.shape, conv.params, *alloc, e);
    };

    cuda::ConvEngine first(0, stream);
    if (!graph_api_ready(first) || cuda::conv_fused_epilogue() != cuda::ConvFusedEpilogue::kAuto)
      GTEST_SKIP() << "cuDNN's graph API with measured fusion is not in use: " << first.version();
    first.keep_choices_in(next_store());
    const bool fused = fused_run(first);
    if (!fused && checks == 0 && separate_calls == 0) GTEST_SKIP() << "cuDNN offers no fused plan for this convolution";
    EXPECT_EQ(fused, agree) << "a fused plan that agrees beats a 256 MiB memset, and one that does not is refused";
    EXPECT_GT(separate_calls, 1) << "the first process compared the fused plan with the separate pass";

    separate_calls = checks = 0;
    cuda::ConvEngine later(0, stream);
    later.keep_choices_in(next_store());
    const cuda::ConvGraphStats before = cuda::conv_graph_stats();
    EXPECT_EQ(fused_run(later), fused);
    const cuda::ConvGraphStats after = cuda::conv_graph_stats();
    EXPECT_EQ(after.autotuned - before.autotuned, 0) << "a kept plan was timed again";
    EXPECT_GE(after.from_store - before.from_store, 1);
    EXPECT_EQ(checks, fused ? 1 : 0) << (fused ? "a kept fused plan's result is checked once" : "a refused fusion is not tried again");
    EXPECT_EQ(separate_calls, fused ? 1 : 0) << "the later process compared the fused plan again";
  }
};

TEST_F(CudaKeptFusedVerdict, AFusedPlanThatAgreesIsKeptAndOnlyCheckedAgain) { check_a_later_process_keeps_the_verdict(true); }
TEST_F(CudaKeptFusedVerdict, ARefusedFusionIsNotTriedAgain) { check_a_later_process_keeps_the_verdict(false); }

// The backend's start-up thread (CudaBackend::prewarm) loads cuDNN's engine libraries from cuDNN's own folder, so that
// the first plan does not open them.
TEST(CudaStartup, CudnnEngineLibrariesAreLoadedFromCudnnsFolder) {
  ATELIER_REQUIRE_CUDA();
  const cuda::ConvEngine conv(0, test::cuda_be().stream());  // loads cuDNN (no plan yet)
  if (!conv.available()) GTEST_SKIP() << "cuDNN is not loaded: " << conv.why_unavailable();
  cuda::load_cudnn_engine_libraries();
  for (const char* name : {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9"}) {
    void* lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(lib, nullptr) << name << " was not loaded";
    if (lib) dlclose(lib);
  }
}

}  // namespace
}  // namespace atelier
