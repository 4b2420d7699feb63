// The decoders the fuzz target exercises: every registered compressor, at its defaults and at
// another setting (the first byte of a fuzz input picks one), and the max-min codec's own
// header parser. Shared by the target and by the seed-corpus generator.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compressors/registry.h"

namespace cgx::fuzz {

struct Case {
  std::string label;
  std::unique_ptr<Compressor> compressor;
};

// Every registry entry at its defaults, then the non-default settings below.
inline std::vector<Case> make_cases() {
  std::vector<Case> out;
  for (const std::string& name : compressor_names()) out.push_back({name, make_compressor(name)});
  const std::vector<std::pair<std::string, std::map<std::string, double>>> more = {
      {"maxmin", {{"bits", 1}, {"bucket_size", 7}}},
      {"maxmin", {{"bits", 8}, {"bucket_size", 4096}, {"skip_incomplete_buckets", 1}}},
      {"maxmin", {{"bits", 3}, {"bucket_size", 64}, {"stochastic", 1}}},
      {"qsgd", {{"bits", 2}, {"bucket_size", 0}}},
      {"topk", {{"ratio", 0.5}}},
      {"randomk", {{"ratio", 0.3}, {"scale", 1}}},
      {"threshold", {{"tau", 0.5}}},
      {"tbq", {{"tau", 0.1}}},
  };
  for (const auto& [name, params] : more) {
    std::string label = name;
    for (const auto& [k, v] : params) {
      char value[32];
      std::snprintf(value, sizeof(value), "%g", v);
      label += ":" + k + "=" + value;
    }
    out.push_back({label, make_compressor(name, params)});
  }
  return out;
}

}  // namespace cgx::fuzz
