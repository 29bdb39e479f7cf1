// The queue between the HTTP front and the device workers, behind an interface so that a shared queue
// (issue 9: Redis Streams with a consumer group, where push is XADD, pop a claim by a worker, push_front
// the reclaim of a dead worker's entry, remove an acknowledgement without a result) can replace the
// in-process one without touching the scheduler or the HTTP layer.
//
// Order is FIFO (fair): jobs leave in submission order, except that a job handed back after a device failure
// goes to the front, since it has already waited its turn.
#pragma once
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "serve/job.h"

namespace atelier::serve {

class WorkQueue {
 public:
  virtual ~WorkQueue() = default;
  // Accepts a job at the back; kResourceExhausted when capacity() jobs are already waiting.
  virtual Status push(JobPtr job) = 0;
  // Returns a job taken earlier to the front (its device failed); never refused.
  virtual void push_front(JobPtr job) = 0;
  // The job at the front, without taking it; nullptr when empty.
  virtual JobPtr front() const = 0;
  // Takes the job at the front; nullptr when empty.
  virtual JobPtr pop() = 0;
  // Takes a waiting job out (cancellation, timeout); false when it is not waiting.
  virtual bool remove(const std::string& id) = 0;
  // 0-based position of a waiting job, -1 when it is not waiting.
  virtual int position(const std::string& id) const = 0;
  virtual size_t depth() const = 0;
  virtual size_t capacity() const = 0;
};

// The in-process bounded FIFO.
class LocalWorkQueue final : public WorkQueue {
 public:
  explicit LocalWorkQueue(size_t capacity) : capacity_(capacity) {}
  Status push(JobPtr job) override;
  void push_front(JobPtr job) override;
  JobPtr front() const override;
  JobPtr pop() override;
  bool remove(const std::string& id) override;
  int position(const std::string& id) const override;
  size_t depth() const override;
  size_t capacity() const override { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<JobPtr> jobs_;
};

}  // namespace atelier::serve
