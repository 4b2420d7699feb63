#include "registry.h"

#include "core/error.h"

namespace cgx {

#define CGX_COMPRESSOR(name, id)         \
  std::vector<ParamSpec> specs_##name(); \
  std::unique_ptr<Compressor> make_##name(const ParamValues& params, uint8_t cid);
#include "list.h"
#undef CGX_COMPRESSOR

const std::vector<CompressorEntry>& compressor_registry() {
  static const std::vector<CompressorEntry> entries = {
#define CGX_COMPRESSOR(name, id) {#name, uint8_t(id), &specs_##name, &make_##name},
#include "list.h"
#undef CGX_COMPRESSOR
  };
  return entries;
}

std::vector<std::string> compressor_names() {
  std::vector<std::string> names;
  for (const auto& e : compressor_registry()) names.emplace_back(e.name);
  return names;
}

const CompressorEntry& compressor_entry(const std::string& name) {
  for (const auto& e : compressor_registry()) {
    if (name == e.name) return e;
  }
  std::string known;
  for (const auto& e : compressor_registry())
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw_invalid("unknown compressor '", name, "' (registered: ", known, ")");
}

std::unique_ptr<Compressor> make_compressor(const std::string& name,
                                            const std::map<std::string, double>& params) {
  const CompressorEntry& e = compressor_entry(name);
  return e.make(ParamValues(name, e.specs(), params), e.id);
}

}  // namespace cgx
