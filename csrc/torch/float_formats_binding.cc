// The MX float formats' CPU fast path for torch_cgx/compressors/floats.py: tensors in, the
// torch-free kernels of core/float_formats.h over the codec's thread pool (whole blocks each).
#include "float_formats_binding.h"

#include <torch/csrc/utils/pybind.h>

#include "core/error.h"
#include "core/float_formats.h"
#include "core/thread_pool.h"

namespace cgx::binding {
namespace {

floats::Element element(const pybind11::tuple& t) {
  CGX_CHECK_ARG(t.size() == 6, "element must be (ebits, mbits, bias, max, emax, special)");
  floats::Element e;
  e.ebits = t[0].cast<int>();
  e.mbits = t[1].cast<int>();
  e.bias = t[2].cast<int>();
  e.max = t[3].cast<float>();
  e.emax = t[4].cast<int>();
  e.special = t[5].cast<int>();
  CGX_CHECK_ARG(e.ebits >= 1 && e.mbits >= 0 && e.bits() <= 8, "element of ", e.bits(), " bits");
  return e;
}

void check_cpu(const at::Tensor& t, at::ScalarType type, const char* what) {
  CGX_CHECK_ARG(t.device().is_cpu() && t.is_contiguous() && t.dim() == 1 && t.scalar_type() == type,
                what, " must be a contiguous 1-D CPU tensor of ", c10::toString(type));
}

// f(first, last) over the blocks [0, blocks) in tasks of whole blocks (about 64K values each),
// spread over the codec's threads (ATen's parallel_for would run serially here: its OpenMP
// loop is in a header, and this extension is built without -fopenmp).
template <class F>
void over_blocks(int64_t blocks, int64_t block, const F& f) {
  const int64_t per = std::max<int64_t>(1, (int64_t(1) << 16) / block);
  cgx::parallel_for((blocks + per - 1) / per,
                    [&](int64_t t) { f(t * per, std::min(blocks, (t + 1) * per)); });
}

}  // namespace

void bind_float_formats(pybind11::module& m) {
  m.def(
      "mx_encode",
      [](const at::Tensor& x, const pybind11::tuple& el, int64_t block, bool stochastic,
         uint64_t seed, uint64_t stream, at::Tensor out) {
        check_cpu(x, at::kFloat, "x");
        check_cpu(out, at::kByte, "out");
        CGX_CHECK_ARG(block == 32, "MX blocks hold 32 values, got ", block);
        const floats::Element e = element(el);
        const int64_t n = x.numel(), blocks = (n + block - 1) / block;
        CGX_CHECK_ARG(size_t(out.numel()) == floats::mx_body_bytes(n, e, block), "an MX body of ",
                      out.numel(), " bytes cannot hold ", n, " values");
        const float* in = x.data_ptr<float>();
        uint8_t* body = out.data_ptr<uint8_t>();
        const RngKey key = rng_key(seed, stream);
        pybind11::gil_scoped_release no_gil;
        over_blocks(blocks, block, [&](int64_t first, int64_t last) {
          floats::mx_encode(in, n, e, block, stochastic, key, first, last, body);
        });
        return out;
      },
      pybind11::arg("x"), pybind11::arg("element"), pybind11::arg("block"),
      pybind11::arg("stochastic"), pybind11::arg("seed"), pybind11::arg("stream"),
      pybind11::arg("out"));
  m.def(
      "mx_decode_into",
      [](const at::Tensor& body, const pybind11::tuple& el, int64_t block, at::Tensor out,
         bool add) {
        check_cpu(body, at::kByte, "body");
        check_cpu(out, at::kFloat, "out");
        const floats::Element e = element(el);
        const int64_t n = out.numel(), blocks = (n + block - 1) / block;
        CGX_CHECK_ARG(block == 32, "MX blocks hold 32 values, got ", block);
        CGX_CHECK_ARG(size_t(body.numel()) == floats::mx_body_bytes(n, e, block), "an MX body of ",
                      body.numel(), " bytes cannot hold ", n, " values");
        const uint8_t* in = body.data_ptr<uint8_t>();
        float* dst = out.data_ptr<float>();
        pybind11::gil_scoped_release no_gil;
        over_blocks(blocks, block, [&](int64_t first, int64_t last) {
          floats::mx_decode(in, n, e, block, first, last, dst, add);
        });
      },
      pybind11::arg("body"), pybind11::arg("element"), pybind11::arg("block"), pybind11::arg("out"),
      pybind11::arg("add"));
}

}  // namespace cgx::binding
