// The CPU's stand-in for CUDA graphs (Backend::capture), so that a captured training pass
// is tested without a GPU: every call passes on to another backend (the CPU's), except that
// capture() records the ops and memory calls queued through it, without running them,
// and replay() runs the recording in order, with the arguments and memory of the capture,
// as a graph's launch does.
//
// It refuses a capture (capture() returns null, nothing of it run) wherever CUDA's would
// fail or capture something wrong: a result the host reads (a download, synchronize(), an
// op that returns its value), a copy from host memory (a graph would copy from that
// address at each replay, whatever it then holds), a free. Its replay is refused once
// memory has been freed since the capture (a pointer of the recording may be stale), as
// the CUDA backend's is. So the host logic of captured passes (what is uploaded outside
// the pass, what lives in memory, when a pass is captured again) runs here as on a GPU,
// and a test compares it with uncaptured training bit for bit (CapturedPasses.*).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/forwarding_backend.h"

namespace thpc {

class CapturingBackend : public ForwardingBackend {
 public:
  explicit CapturingBackend(Backend& inner) : ForwardingBackend(inner) {}

  bool can_capture(CaptureUse /*use*/) const override { return true; }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& queue_work) override {
    THPC_CHECK(recording_ == nullptr, "a capture inside a capture");
    auto calls = std::make_shared<std::vector<std::function<void()>>>();
    recording_ = calls.get();
    try {
      queue_work();
    } catch (const Refused& refused) {
      recording_ = nullptr;
      ++refused_captures_;
      last_refusal_ = refused.what;
      return nullptr;
    } catch (...) {
      // As the CUDA backend's: whatever the work threw ends the capture, refused; the
      // uncaptured run that follows meets the same error, if it is lasting.
      recording_ = nullptr;
      ++refused_captures_;
      last_refusal_ = "the work threw";
      return nullptr;
    }
    recording_ = nullptr;
    ++captures_;
    return std::make_unique<Recording>(*this, std::move(calls));
  }

  // What this backend has done, for the tests' checks.
  int captures() const { return captures_; }
  int replays() const { return replays_; }
  int refused_captures() const { return refused_captures_; }
  int refused_replays() const { return refused_replays_; }
  const std::string& last_refusal() const { return last_refusal_; }

  // ---- memory ----
  void free(Tensor& tensor) override {
    refuse_while_capturing("free");
    ++frees_;
    inner().free(tensor);
  }
  void free_ids(int32_t*& ids) override {
    refuse_while_capturing("free_ids");
    ++frees_;
    inner().free_ids(ids);
  }
  void zero(Tensor tensor) override {
    if (recording_ != nullptr) return record([this, tensor] { inner().zero(tensor); });
    inner().zero(tensor);
  }
  void copy(Tensor dst, Tensor src) override {
    if (recording_ != nullptr) return record([this, dst, src] { inner().copy(dst, src); });
    inner().copy(dst, src);
  }
  void upload(Tensor dst, const void* host) override {
    refuse_while_capturing("upload from host memory");
    inner().upload(dst, host);
  }
  void download(void* host, Tensor src) override {
    refuse_while_capturing("download to the host");
    inner().download(host, src);
  }
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
    refuse_while_capturing("upload_ids from host memory");
    inner().upload_ids(dst, host, count);
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    refuse_while_capturing("download_ids to the host");
    inner().download_ids(host, src, count);
  }
  void synchronize() override {
    refuse_while_capturing("synchronize");
    inner().synchronize();
  }

  // ---- the ops: recorded with their arguments (copies) while capturing ----
#define THPC_OP(ret, name, params, args)                                          \
  ret name params override {                                                     \
    if (recording_ != nullptr) {                                                 \
      if (!std::is_void_v<ret>) refuse(#name " returns its result to the host"); \
      record([=] { (void)inner().name args; });                                  \
      return ret();                                                              \
    }                                                                            \
    return inner().name args;                                                    \
  }
#include "kernels/op_list.h"
#undef THPC_OP

 private:
  struct Refused {
    std::string what;
  };
  class Recording final : public CapturedWork {
   public:
    Recording(CapturingBackend& owner, std::shared_ptr<std::vector<std::function<void()>>> calls)
        : owner_(owner), calls_(std::move(calls)), frees_at_capture_(owner.frees_) {}
    bool replay() override {
      THPC_CHECK(owner_.recording_ == nullptr, "a replay inside a capture");
      if (owner_.frees_ != frees_at_capture_) {
        ++owner_.refused_replays_;
        return false;
      }
      ++owner_.replays_;
      for (const auto& call : *calls_) call();
      return true;
    }

   private:
    CapturingBackend& owner_;
    std::shared_ptr<std::vector<std::function<void()>>> calls_;
    uint64_t frees_at_capture_;
  };

  void record(std::function<void()> call) { recording_->push_back(std::move(call)); }
  [[noreturn]] void refuse(const std::string& what) { throw Refused{what}; }
  void refuse_while_capturing(const char* what) {
    if (recording_ != nullptr) refuse(what);
  }

  std::vector<std::function<void()>>* recording_ = nullptr;
  uint64_t frees_ = 0;
  int captures_ = 0, replays_ = 0, refused_captures_ = 0, refused_replays_ = 0;
  std::string last_refusal_;
};

}  // namespace thpc
