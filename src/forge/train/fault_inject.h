// A testing hook: faults the trainer injects into chosen steps, so that tests (and a user who
// wants to see what a run does when a step goes bad) can make the numerical guard fire
// deterministically. The CLI fills it from FORGE_FAULT_INJECT (apps/forge/run_env.h); nothing
// else sets it, and an empty plan costs nothing.
//
// Syntax: comma-separated KIND@STEP or KIND@FIRST-LAST (inclusive), steps 0-based as in
// metrics.jsonl's "step"; KIND is nan_grad (a gradient element becomes NaN, so the global norm
// is NaN) or nan_loss (the step's loss becomes NaN, its gradients stay finite). Example:
// FORGE_FAULT_INJECT=nan_grad@3,nan_loss@10-14. kill@STEP (one step, no range): the process
// sends itself SIGKILL as that step begins, as a crash or the kernel's OOM killer would end it;
// for tests of what the other ranks of a data-parallel run do when one dies.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "forge/train/runner.h"

namespace forge {

struct FaultPlan {
  struct Entry {
    StepFault fault;
    int first, last;  // steps, inclusive
  };
  std::vector<Entry> entries;
  int kill_at = -1;  // kill@STEP's step; -1: none

  // The fault to inject into `step`, if any (the first entry that covers it).
  std::optional<StepFault> at(int step) const;
  bool empty() const { return entries.empty() && kill_at < 0; }
};

// Parses the syntax above; throws forge::Error naming the bad part.
FaultPlan parse_fault_plan(const std::string& spec);

}  // namespace forge
