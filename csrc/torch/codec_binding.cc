// torch.Tensor front of the torch-free codec (csrc/core/codec.h). Python callers go through
// torch_cgx/codec.py, which checks devices and layouts and documents the API.
#include "codec_binding.h"

#include <ATen/ops/empty.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "core/codec.h"
#include "core/codec_kernels.h"
#include "core/thread_pool.h"
#include "dtype_map.h"

namespace cgx::binding {
namespace {

at::Tensor encode(const at::Tensor& input, int bits, int64_t bucket_size, bool skip_incomplete,
                  bool stochastic, bool clip, uint64_t seed, uint64_t stream,
                  std::optional<at::Tensor> out) {
  TORCH_CHECK(input.device().is_cpu() && input.is_contiguous(),
              "encode takes a contiguous CPU tensor");
  CodecParams p;
  p.bits = bits;
  p.bucket_size = bucket_size;
  p.skip_incomplete_buckets = skip_incomplete;
  p.rounding = stochastic ? Rounding::kStochastic : Rounding::kNearest;
  p.clip = clip;
  p.seed = seed;
  p.stream = stream;
  const DType dtype = to_cgx_dtype(input.scalar_type());
  const size_t size = encoded_size(input.numel(), dtype, p);
  at::Tensor payload;
  if (out) {  // reuse the caller's buffer: no allocation (and page faults) per call
    payload = *out;
    CGX_CHECK_ARG(payload.device().is_cpu() && payload.is_contiguous() &&
                      payload.scalar_type() == at::kByte && payload.dim() == 1,
                  "out must be a contiguous 1-D CPU uint8 tensor");
    CGX_CHECK_ARG(size_t(payload.numel()) == size, "out has ", payload.numel(),
                  " bytes; this payload needs exactly ", size);
  } else {
    payload = at::empty({int64_t(size)}, input.options().dtype(at::kByte));
  }
  {
    pybind11::gil_scoped_release no_gil;
    cgx::encode(input.data_ptr(), dtype, input.numel(), p, payload.data_ptr<uint8_t>(), size);
  }
  return payload;
}

void decode_into(const at::Tensor& payload, at::Tensor& out, bool add) {
  TORCH_CHECK(
      payload.device().is_cpu() && payload.is_contiguous() && payload.scalar_type() == at::kByte,
      "payload must be a contiguous CPU uint8 tensor");
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous(), "out must be a contiguous CPU tensor");
  const DType dtype = to_cgx_dtype(out.scalar_type());
  pybind11::gil_scoped_release no_gil;
  if (add) {
    cgx::decode_add(payload.data_ptr<uint8_t>(), size_t(payload.numel()), out.data_ptr(), dtype,
                    out.numel());
  } else {
    cgx::decode(payload.data_ptr<uint8_t>(), size_t(payload.numel()), out.data_ptr(), dtype,
                out.numel());
  }
}

pybind11::dict inspect(const at::Tensor& payload) {
  TORCH_CHECK(
      payload.device().is_cpu() && payload.is_contiguous() && payload.scalar_type() == at::kByte,
      "payload must be a contiguous CPU uint8 tensor");
  const PayloadInfo info = cgx::inspect(payload.data_ptr<uint8_t>(), size_t(payload.numel()));
  pybind11::dict d;
  d["dtype"] = dtype_name(info.dtype);
  d["bits"] = info.bits;
  d["bucket_size"] = info.bucket_size;
  d["skip_incomplete_buckets"] = info.raw_tail;
  d["stochastic"] = info.stochastic;
  d["clipped"] = info.clipped;
  d["count"] = info.count;
  return d;
}

size_t size_of(int64_t count, const std::string& dtype, int bits, int64_t bucket_size,
               bool skip_incomplete) {
  CodecParams p;
  p.bits = bits;
  p.bucket_size = bucket_size;
  p.skip_incomplete_buckets = skip_incomplete;
  return cgx::encoded_size(count, dtype_from_name(dtype), p);
}

}  // namespace

void bind_codec(pybind11::module& m) {
  m.def("encode", &encode);
  m.def("decode_into", &decode_into);
  m.def("inspect", &inspect);
  m.def("encoded_size", &size_of);
  m.def("num_threads", &cgx::num_threads);
  m.def("set_num_threads", &cgx::set_num_threads);
  m.def("isa", &kernels::isa);
  m.def("set_isa", &kernels::set_isa);
}

}  // namespace cgx::binding
