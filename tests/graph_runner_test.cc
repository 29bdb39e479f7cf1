// The recorded-execution runner on a device that cannot record (the CPU): every call runs the function,
// counted as eager; results are the function's. The CUDA side is tests/cuda_graph_test.cc.
#include <gtest/gtest.h>

#include "backend/graph_runner.h"
#include "backend/ops.h"

namespace atelier {
namespace {

TEST(GraphRunner, CpuRunsEveryCallEagerly) {
  GraphRunner runner;
  int calls = 0;
  const auto fn = [&calls](const std::vector<Tensor>& in) {
    ++calls;
    return ops::affine(in[0], 2.0f, 1.0f);
  };
  for (int i = 0; i < 3; ++i) {
    const Tensor out = runner.run({Tensor::full({4}, float(i))}, Device::cpu(), fn);
    EXPECT_EQ(out.to_vector()[2], 2.0f * float(i) + 1.0f);
  }
  EXPECT_EQ(calls, 3);
  const GraphRunner::Stats s = runner.stats();
  EXPECT_EQ(s.eager_calls, 3);
  EXPECT_EQ(s.captures, 0);
  EXPECT_EQ(s.replays, 0);
  EXPECT_EQ(s.pool_bytes, 0u);
}

}  // namespace
}  // namespace atelier
