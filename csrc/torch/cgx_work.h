// The Work returned by the cgx backend for operations it runs itself (on its worker thread):
// wait() and getFuture() behave like Gloo's; the future's value is the list of output tensors.
#pragma once

#include <ATen/core/ivalue.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace cgx::binding {

class CGXWork : public c10d::Work {
 public:
  CGXWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Called once by the worker: completes the future with the outputs, or with the error.
  void finish(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace cgx::binding
