#include "cgx_work.h"

namespace cgx::binding {

CGXWork::CGXWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool CGXWork::isCompleted() { return future_->completed(); }

bool CGXWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr CGXWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

std::vector<at::Tensor> CGXWork::result() { return outputs_; }

bool CGXWork::wait(std::chrono::milliseconds /*timeout*/) {
  // The worker's inner operations carry the process group's timeout, so the future always
  // completes (with an error if a peer died or stalled).
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CGXWork::getFuture() { return future_; }

void CGXWork::finish(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace cgx::binding
