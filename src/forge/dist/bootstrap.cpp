// Launcher environments → LaunchInfo (dist/bootstrap.h).
#include "forge/dist/bootstrap.h"

#include <climits>
#include <cstdlib>

#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge {

namespace {

struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// In order of precedence (bootstrap.h says why).
constexpr LauncherVars kLaunchers[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

std::string required(const EnvLookup& env, const char* name, const LauncherVars& l) {
  auto v = env(name);
  if (!v)
    throw Error(
        str(l.launcher, " environment: ", l.rank, " or ", l.size, " is set but ", name, " is not"));
  return *v;
}

// An index below `size`, named in the message by both variables.
int parse_index(const std::string& name, const std::string& text, const char* size_name, int size) {
  const int i = parse_int(name, text, 0, INT_MAX);
  if (i >= size) throw Error(str(name, "=", i, " is not below ", size_name, "=", size));
  return i;
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& env) {
  for (const auto& l : kLaunchers) {
    if (!env(l.rank) && !env(l.size)) continue;
    LaunchInfo info;
    info.launcher = l.launcher;
    info.size = parse_int(l.size, required(env, l.size, l), 1, INT_MAX);
    info.rank = parse_index(l.rank, required(env, l.rank, l), l.size, info.size);
    info.local_rank = parse_index(l.local_rank, required(env, l.local_rank, l), l.size, info.size);
    if (info.launcher == "torchrun") {
      info.master_addr = required(env, "MASTER_ADDR", l);
      if (info.master_addr.empty()) throw Error("torchrun environment: MASTER_ADDR is empty");
      info.master_port = parse_int("MASTER_PORT", required(env, "MASTER_PORT", l), 1, 65535);
    }
    return info;
  }
  return LaunchInfo{};
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

}  // namespace forge
