// The compressor registry: names, parameter specs and factories of every compressor listed in
// list.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/compressor.h"

namespace cgx {

// Each compressor file defines these two for its name (see list.h).
using CompressorFactory = std::unique_ptr<Compressor> (*)(const ParamValues&, uint8_t id);

struct CompressorEntry {
  const char* name;
  uint8_t id;
  std::vector<ParamSpec> (*specs)();
  CompressorFactory make;
};

const std::vector<CompressorEntry>& compressor_registry();
std::vector<std::string> compressor_names();
const CompressorEntry& compressor_entry(const std::string& name);  // InvalidArgument if unknown

// The compressor `name` with `params` (unknown names, bad values: InvalidArgument).
std::unique_ptr<Compressor> make_compressor(const std::string& name,
                                            const std::map<std::string, double>& params = {});

}  // namespace cgx
