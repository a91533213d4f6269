#include "forge/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace forge {
namespace {

LogLevel level_from_env() {
  const char* e = std::getenv("FORGE_LOG");
  if (e == nullptr) return LogLevel::kInfo;
  if (std::strcmp(e, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(e, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(e, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

LogLevel g_level = level_from_env();

}  // namespace

LogLevel log_level() { return g_level; }
void set_log_level(LogLevel level) { g_level = level; }

void log_write(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "[forge %s] %s\n", names[static_cast<int>(level)], msg.c_str());
}

}  // namespace forge
