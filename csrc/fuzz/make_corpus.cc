// Writes the fuzz target's seed corpus: valid payloads of every decoder of fuzz_cases.h (and of
// the max-min codec) for a few counts and input dtypes, each behind the target's 4-byte prefix.
//
//   make_corpus DIR        (the checked-in corpus: csrc/fuzz/corpus)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/codec.h"
#include "fuzz/fuzz_cases.h"

namespace {

void write(const std::string& path, size_t pick, uint8_t side, int64_t count,
           const std::vector<uint8_t>& payload) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  const uint8_t prefix[4] = {uint8_t(pick), side, uint8_t(count & 0xff), uint8_t(count >> 8)};
  std::fwrite(prefix, 1, 4, f);
  std::fwrite(payload.data(), 1, payload.size(), f);
  std::fclose(f);
}

std::vector<float> values(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  if (n > 2) v[1] = 0.f;  // a zero and an outlier: the edges the decoders must handle
  if (n > 5) v[5] = 1e4f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto cases = cgx::fuzz::make_cases();
  const int64_t counts[] = {1, 37, 600};
  int files = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int64_t n : counts) {
      const std::vector<float> v = values(n, uint32_t(i * 100 + size_t(n)));
      const cgx::Compressor& c = *cases[i].compressor;
      std::vector<uint8_t> out(c.max_encoded_size(n, cgx::DType::kFloat32));
      cgx::EncodeContext ctx;
      ctx.seed = 1;
      const size_t size = c.encode(v.data(), cgx::DType::kFloat32, n, ctx, out.data(), out.size());
      out.resize(size);
      write(dir + "/" + cases[i].label + "-" + std::to_string(n), i, uint8_t(8 | (n % 3)), n, out);
      ++files;
    }
  }
  for (int bits : {1, 4, 8}) {  // the max-min codec's own parser
    cgx::CodecParams p;
    p.bits = bits;
    p.bucket_size = 64;
    const int64_t n = 300;
    const std::vector<float> v = values(n, uint32_t(bits));
    std::vector<uint8_t> out(cgx::encoded_size(n, cgx::DType::kFloat32, p));
    cgx::encode(v.data(), cgx::DType::kFloat32, n, p, out.data(), out.size());
    write(dir + "/codec-bits" + std::to_string(bits), cases.size(), 8, n, out);
    ++files;
  }
  std::printf("%d seed payloads in %s\n", files, dir.c_str());
  return 0;
}
