#include "call_settings.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "process_group_cgx.h"

namespace cgx::binding {
namespace {

// bits, bucket_size, skip_incomplete_buckets: the table's call settings, in its order.
constexpr const char* const* kVars = rules::kCallVars;
static_assert(rules::kCallSettings == 3);

std::optional<std::string> read(const char* var) {
  const char* v = std::getenv(var);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// What the group is told on the wire: one rank's three values.
struct Wire {
  uint32_t magic = 0x53584743;  // "CGXS"
  int32_t bits = 0;
  uint64_t bucket = 0;
  uint32_t skip = 0;
  uint32_t pad = 0;
};

}  // namespace

int64_t parse_env_int(const std::string& var, const std::string& raw) {
  const std::string t = trim(raw);
  size_t i = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? 1 : 0;
  bool digits = i < t.size();
  for (size_t j = i; digits && j < t.size(); ++j) {
    digits = std::isdigit(static_cast<unsigned char>(t[j])) != 0;
  }
  CGX_CHECK_ARG(digits, var, " must be an integer, got '", raw, "'");
  errno = 0;
  const long long v = std::strtoll(t.c_str(), nullptr, 10);
  CGX_CHECK_ARG(errno != ERANGE, var, " is out of range (|value| < 2^63), got '", raw, "'");
  return v;
}

bool parse_env_bool(const std::string& var, const std::string& raw) {
  std::string t = trim(raw);
  for (char& ch : t) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  ::cgx::throw_invalid(var, " must be 0 or 1, got '", raw, "'");
}

CallSettings::CallSettings() {
  for (size_t i = 0; i < seen_.size(); ++i) seen_[i] = read(kVars[i]);
}

bool CallSettings::refresh(BackendConfig& config) {
  std::array<std::optional<std::string>, rules::kCallSettings> now;
  bool changed = false;
  for (size_t i = 0; i < now.size(); ++i) {
    now[i] = read(kVars[i]);
    changed |= now[i] != seen_[i];
  }
  if (!changed) return false;
  const BackendConfig defaults;
  BackendConfig next = config;
  auto given = [&](size_t i) { return now[i] && !trim(*now[i]).empty(); };
  if (now[0] != seen_[0]) {
    next.bits = given(0) ? int(parse_env_int(kVars[0], *now[0])) : defaults.bits;
    CGX_CHECK_ARG(rules::kBitsRange.ok(next.bits), kVars[0], " ", rules::kBitsRange.text, ", got '",
                  *now[0], "'");
  }
  if (now[1] != seen_[1]) {
    next.bucket_size = given(1) ? parse_env_int(kVars[1], *now[1]) : defaults.bucket_size;
    CGX_CHECK_ARG(rules::kBucketSizeRange.ok(next.bucket_size), kVars[1], " ",
                  rules::kBucketSizeRange.text, ", got '", *now[1], "'");
  }
  if (now[2] != seen_[2]) {
    next.skip_incomplete_buckets =
        given(2) ? parse_env_bool(kVars[2], *now[2]) : defaults.skip_incomplete_buckets;
  }
  config = next;
  seen_ = now;
  return true;
}

void agree_call_settings(Transport& t, const BackendConfig& c) {
  Wire mine;
  mine.bits = c.bits;
  mine.bucket = uint64_t(c.bucket_size);
  mine.skip = c.skip_incomplete_buckets ? 1 : 0;
  const int world = t.size();
  std::vector<Wire> all(static_cast<size_t>(world));
  t.allgather(reinterpret_cast<const uint8_t*>(&mine), sizeof(Wire),
              reinterpret_cast<uint8_t*>(all.data()));
  std::string why;  // no iostreams in messages (core/error.h)
  auto column = [&](const char* var, auto value) {
    for (const Wire& w : all) {
      if (value(w) != value(all[0])) {
        why += text(why.empty() ? "" : "; ", var, ":");
        for (int r = 0; r < world; ++r) why += text(" rank ", r, " ", value(all[size_t(r)]));
        return;
      }
    }
  };
  for (const Wire& w : all) {
    CGX_CHECK_ARG(w.magic == mine.magic,
                  "cgx: a rank's allreduce met another collective "
                  "(the ranks issued different operations)");
  }
  column(kVars[0], [](const Wire& w) { return w.bits; });
  column(kVars[1], [](const Wire& w) { return w.bucket; });
  column(kVars[2], [](const Wire& w) { return w.skip; });
  CGX_CHECK_ARG(why.empty(),
                "cgx: the ranks' compression settings differ at this "
                "allreduce (",
                why,
                "); set them alike on every rank (the variables are "
                "read at every allreduce, as CGX does; CGX_SETTINGS_PER_CALL=0 reads them once)");
}

}  // namespace cgx::binding
