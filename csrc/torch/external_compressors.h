// Compressors written in Python (torch_cgx.compressors.register): the binding knows only their
// names. Their calls go to the group's device plane, which runs them in tensor operations on any
// device; the native engine never sees them (call_options.cc skips building them, the adapter
// routes them: device_plane.h).
#pragma once

#include <string>

namespace cgx::binding {

void declare_external_compressor(const std::string& name);
bool is_external_compressor(const std::string& name);
// ValueError when `compressor` is external: a call the device plane did not take (the group has
// none for the tensor's device).
void check_native(const std::string& compressor);

}  // namespace cgx::binding
