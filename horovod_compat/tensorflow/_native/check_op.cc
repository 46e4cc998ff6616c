// HorovodCompatCheck: the TensorFlow op that ends a collective's graph node.
//
// A collective runs in a tf.numpy_function node, and TensorFlow reports any Python exception
// raised there as UnknownError (ValueError/TypeError as InvalidArgumentError).  Horovod's own
// kernels fail with the status of the failure -- FailedPreconditionError for ranks that disagree
// on an op -- and programs catch that type.  So the node returns the status instead of raising:
// `code` (a TensorFlow error code, 0 for OK) and `message`; this op fails the step with exactly
// that status, or forwards `values` (the node's results, not copied) when the code is 0.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;

REGISTER_OP("HorovodCompatCheck")
    .Input("code: int32")
    .Input("message: string")
    .Input("values: T")
    .Output("out: T")
    .Attr("T: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 2; i < c->num_inputs(); ++i) c->set_output(i - 2, c->input(i));
      return absl::OkStatus();
    });

class HorovodCompatCheckOp : public OpKernel {
 public:
  explicit HorovodCompatCheckOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* c) override {
    const int code = c->input(0).scalar<int32_t>()();
    if (code != 0) {
      c->SetStatus(absl::Status(static_cast<absl::StatusCode>(code),
                                std::string(c->input(1).scalar<::tensorflow::tstring>()())));
      return;
    }
    for (int i = 2; i < c->num_inputs(); ++i) c->set_output(i - 2, c->input(i));
  }
};

REGISTER_KERNEL_BUILDER(Name("HorovodCompatCheck").Device(::tensorflow::DEVICE_CPU),
                        HorovodCompatCheckOp);

}  // namespace
