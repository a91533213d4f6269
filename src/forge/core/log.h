// The one global: a logger writing to stderr. Level from FORGE_LOG (debug|info|warn|error),
// default info. Progress lines and results go to stdout through the CLI, not through here.
#pragma once

#include <string>

#include "forge/core/error.h"

namespace forge {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, const std::string& msg);

template <typename... Args>
void log_debug(const Args&... a) { if (log_level() <= LogLevel::kDebug) log_write(LogLevel::kDebug, str(a...)); }
template <typename... Args>
void log_info(const Args&... a) { if (log_level() <= LogLevel::kInfo) log_write(LogLevel::kInfo, str(a...)); }
template <typename... Args>
void log_warn(const Args&... a) { if (log_level() <= LogLevel::kWarn) log_write(LogLevel::kWarn, str(a...)); }

}  // namespace forge
