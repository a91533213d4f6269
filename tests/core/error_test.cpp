#include "forge/core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace forge {
namespace {

TEST(Quote, QuotesAndKeepsPrintableTextAsItIs) {
  EXPECT_EQ(quote("gpt2"), "'gpt2'");
  EXPECT_EQ(quote(""), "''");
  EXPECT_EQ(quote("caf\xc3\xa9 it's"), "'caf\xc3\xa9 it's'");  // UTF-8 and quotes untouched
}

TEST(Quote, EscapesControlCharactersSoTheMessageStaysOneLine) {
  EXPECT_EQ(quote("a\nb\r\tc"), "'a\\x0ab\\x0d\\x09c'");
  EXPECT_EQ(quote(std::string("x\0y", 3)), "'x\\x00y'");
  EXPECT_EQ(quote("\x7f"), "'\\x7f'");
}

TEST(Quote, CutsLongTextAfterMaxBytes) {
  EXPECT_EQ(quote("abcdef", 3), "'abc...'");
  EXPECT_EQ(quote("abc", 3), "'abc'");
  EXPECT_EQ(quote(std::string(1000, 'x')).size(), 120u + 2 + 3);
}

}  // namespace
}  // namespace forge
