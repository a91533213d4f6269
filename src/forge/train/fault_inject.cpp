#include "forge/train/fault_inject.h"

#include <climits>

#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge {

std::optional<StepFault> FaultPlan::at(int step) const {
  for (const Entry& e : entries)
    if (step >= e.first && step <= e.last) return e.fault;
  return std::nullopt;
}

FaultPlan parse_fault_plan(const std::string& spec) {
  FaultPlan plan;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    const std::string what = str("fault '", item, "'");
    const size_t at = item.find('@');
    if (at == std::string::npos)
      throw Error(
          str(what, ": expected KIND@STEP or KIND@FIRST-LAST (KIND nan_grad, nan_loss or kill)"));
    const std::string kind = item.substr(0, at), steps = item.substr(at + 1);
    if (kind == "kill") {
      plan.kill_at = parse_int(what + " step", steps, 0, INT32_MAX);
      continue;
    }
    FaultPlan::Entry e{};
    if (kind == "nan_grad")
      e.fault = StepFault::kNanGrad;
    else if (kind == "nan_loss")
      e.fault = StepFault::kNanLoss;
    else
      throw Error(str(what, ": unknown kind '", kind, "' (expected nan_grad, nan_loss or kill)"));
    const size_t dash = steps.find('-');
    e.first = parse_int(what + " first step", steps.substr(0, dash), 0, INT32_MAX);
    e.last = dash == std::string::npos
                 ? e.first
                 : parse_int(what + " last step", steps.substr(dash + 1), e.first, INT32_MAX);
    plan.entries.push_back(e);
  }
  return plan;
}

}  // namespace forge
