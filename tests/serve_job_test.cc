// A job's event log on its own (serve/job.h): previews reach it from the host pool's threads in any order, and a
// client sees them in step order, each attempt's from its start.
#include <gtest/gtest.h>

#include "serve/job.h"

namespace atelier::serve {
namespace {

// The steps of the job's preview events, in the order a client reads them.
std::vector<int> preview_steps(const Job& job) {
  bool terminal = false;
  std::vector<int> steps;
  for (const JobEvent& e : job.events_after(0, std::chrono::milliseconds(0), &terminal))
    if (e.type == "preview") steps.push_back(e.data["step"].get<int>());
  return steps;
}

TEST(ServeJob, PreviewsOlderThanTheOneShownAreDropped) {
  Job job("j", ServeRequest{}, 60.0);
  job.mark_queued();
  job.mark_running("cpu");
  job.set_preview(2, "b");
  job.set_preview(1, "a");  // encoded after step 2's: stale
  job.set_preview(2, "b2");  // the same step again
  job.set_preview(4, "d");
  EXPECT_EQ(preview_steps(job), (std::vector<int>{2, 4}));
  EXPECT_EQ(job.preview_b64(), "d");
  // A re-queued job starts its steps again, and its previews with them.
  job.mark_requeued("device failed");
  job.mark_running("cpu");
  job.set_preview(1, "again");
  EXPECT_EQ(preview_steps(job), (std::vector<int>{2, 4, 1}));
  EXPECT_EQ(job.preview_b64(), "again");
}

}  // namespace
}  // namespace atelier::serve
