// FORGE_ATTENTION, FORGE_CUDA_GRAPH, FORGE_GEMM_ALGO, FORGE_QKV and FORGE_FAULT_INJECT are read by the CLI alone
// (apps/forge/run_env.cpp): a bad value is a one-line error before any work; the library never
// looks at them (the CUDA side of that is tested in tests/model/transformer_cuda_test.cpp).
#include <string>

#include "cli_runner.h"

namespace forge {
namespace {

using testing::CmdResult;

// Each test runs `ENV forge ARGS` in its own directory.
class RunEnv : public testing::CliTest {};

TEST_F(RunEnv, BadAttentionPathIsAOneLineError) {
  expect_user_error(forge_env("FORGE_ATTENTION=fastest", "train --data /nonexistent --steps 1"),
                    "attention path 'fastest'");
}

TEST_F(RunEnv, BadGraphSwitchIsAOneLineError) {
  const CmdResult r = forge_env("FORGE_CUDA_GRAPH=yes", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("FORGE_CUDA_GRAPH='yes'"), std::string::npos) << r.err;
}

TEST_F(RunEnv, BadGemmAlgoIsAOneLineError) {
  const CmdResult r = forge_env("FORGE_GEMM_ALGO=fastest", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("FORGE_GEMM_ALGO='fastest' (expected heuristic, timed or timed-any)"), std::string::npos) << r.err;
}

TEST_F(RunEnv, BadQkvSwitchIsAOneLineError) {
  const CmdResult r = forge_env("FORGE_QKV=split", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("FORGE_QKV='split' (expected fused or separate)"), std::string::npos) << r.err;
}

TEST_F(RunEnv, BadFaultPlanIsAOneLineError) {
  expect_user_error(
      forge_env("FORGE_FAULT_INJECT=nan_grad@soon", "train --data /nonexistent --steps 1"),
      "FORGE_FAULT_INJECT: fault 'nan_grad@soon'");
}

// A known value passes the CLI's check: the run then fails on the missing data, not the setting.
TEST_F(RunEnv, KnownValuesAreAccepted) {
  const CmdResult r =
      forge_env("FORGE_ATTENTION=flash-wgmma-split FORGE_CUDA_GRAPH=0 FORGE_GEMM_ALGO=timed "
                "FORGE_QKV=separate FORGE_FAULT_INJECT=nan_loss@1-2",
                "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.find("FORGE_"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
  const CmdResult any = forge_env("FORGE_GEMM_ALGO=timed-any", "train --data /nonexistent --steps 1");
  EXPECT_EQ(any.code, 1);
  EXPECT_EQ(any.err.find("FORGE_"), std::string::npos) << any.err;
}

}  // namespace
}  // namespace forge
