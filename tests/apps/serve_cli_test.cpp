// forge serve on the command line: --help, and bad arguments as one-line errors.
#include <gtest/gtest.h>

#include "cli_runner.h"

namespace forge {
namespace {

using testing::CmdResult;

class ServeCliTest : public testing::CliTest {};

TEST_F(ServeCliTest, HelpListsTheRoutesAndFlags) {
  const CmdResult r = forge("serve --help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s : {"--model", "--port", "--api-key", "--max-body", "/v1/chat/completions", "--max-batch",
                        "--max-queue", "--context", "/metrics", "503", "GET / is a chat page"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST_F(ServeCliTest, BadArgumentsAreOneLineErrors) {
  expect_user_error(forge("serve --model " + p("missing")), "no such model directory");
  expect_user_error(forge("serve --bogus"), "--bogus");
  expect_user_error(forge("serve"), "--model");
  expect_user_error(forge("serve --model " + p("") + " --port 70000"), "--port");
  expect_user_error(forge("serve --model " + p("") + " --max-batch 0"), "--max-batch");
  expect_user_error(forge("serve --model " + p("") + " --max-queue -1"), "--max-queue");
  expect_user_error(forge("serve --model " + p("") + " --context 0"), "--context");
}

}  // namespace
}  // namespace forge
