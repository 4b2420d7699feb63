#include "external_compressors.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <set>

#include "compressors/registry.h"
#include "core/error.h"

namespace cgx::binding {
namespace {

std::mutex& names_mutex() {
  static std::mutex m;
  return m;
}

std::set<std::string>& names() {
  static std::set<std::string> s;
  return s;
}

}  // namespace

void declare_external_compressor(const std::string& name) {
  for (const CompressorEntry& e : compressor_registry()) {
    CGX_CHECK_ARG(name != e.name, "compressor ", name, " is a native one");
  }
  std::lock_guard<std::mutex> lock(names_mutex());
  names().insert(name);
}

bool is_external_compressor(const std::string& name) {
  std::lock_guard<std::mutex> lock(names_mutex());
  return names().count(name) != 0;
}

void check_native(const std::string& compressor) {
  TORCH_CHECK_VALUE(!is_external_compressor(compressor), "compressor ", compressor,
                    " is written in Python and runs on the group's device plane, which this group "
                    "lacks for the tensor: register it before the group is created, with "
                    "data_plane auto or device (not host)");
}

}  // namespace cgx::binding
