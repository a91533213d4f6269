// The interpreter against Python's jinja2: every template of tests/data/chat/jinja_cases.json
// (tools/make_chat_template_golden.py) renders to jinja2's text, or fails where jinja2 fails.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/chat/jinja.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {
namespace {

using ojson = nlohmann::ordered_json;

ojson load(const std::string& rel) {
  const std::string path = std::string(FORGE_SOURCE_DIR) + "/tests/data/chat/" + rel;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return ojson::parse(f);
}

// The golden script pins strftime_now to 2024-09-05 12:00:00.
std::tm golden_now() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 8;
  tm.tm_mday = 5;
  tm.tm_hour = 12;
  tm.tm_wday = 4;
  tm.tm_yday = 248;
  return tm;
}

TEST(JinjaGoldenTest, RendersAsJinja2Does) {
  const ojson cases = load("jinja_cases.json");
  ASSERT_GT(cases.size(), 90u);
  int compared = 0, failed = 0;
  for (const ojson& c : cases) {
    const std::string tpl = c["template"];
    RenderInput in;
    in.now = golden_now();
    for (const auto& [k, v] : c["context"].items())
      in.variables.emplace_back(k, from_json(v, kOtherData));
    std::string got, error;
    try {
      got = Template::parse(tpl).render(in).text();
    } catch (const Error& e) {
      error = e.what();
    }
    if (c.contains("text")) {
      ++compared;
      EXPECT_EQ(error, "") << "template: " << tpl;
      EXPECT_EQ(got, c["text"].get<std::string>()) << "template: " << tpl;
    } else {
      ++failed;
      EXPECT_NE(error, "") << "jinja2 fails (" << c["error"].get<std::string>()
                           << ") but Forge rendered: " << got << "\ntemplate: " << tpl;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
      EXPECT_EQ(error.rfind("chat template line ", 0), 0u) << error;
    }
  }
  EXPECT_GT(compared, 70);
  EXPECT_GT(failed, 10);
}

}  // namespace
}  // namespace forge::chat::jinja
