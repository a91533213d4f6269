// loss.svg: drawn from the curves and replaced atomically; a failed write keeps the old plot.
#include "forge/train/plot.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "forge/core/error.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_plot_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  fs::path dir_;
};

TEST_F(PlotTest, DrawsBothCurvesAndAFailedRedrawKeepsTheOldPlot) {
  const std::string svg = (dir_ / "loss.svg").string();
  const Curve train = {{0, 4.0}, {1, 3.5}, {2, 3.1}}, val = {{0, 4.1}, {2, 3.3}};
  write_loss_svg(svg, train, val, "forge: test loss");
  const std::string good = read(svg);
  EXPECT_NE(good.find("<svg"), std::string::npos);
  EXPECT_NE(good.find("forge: test loss"), std::string::npos);
  EXPECT_NE(good.find("validation loss"), std::string::npos);

  // The temporary name points at /dev/full: the redraw fails with ENOSPC and must say so,
  // leaving the previous plot (not a link to /dev/full) in place.
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  fs::create_symlink("/dev/full", svg + ".tmp");
  try {
    write_loss_svg(svg, train, val, "forge: test loss");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(svg + ": cannot write"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::is_symlink(svg));
  EXPECT_EQ(read(svg), good);
  EXPECT_FALSE(fs::exists(fs::symlink_status(svg + ".tmp")));
}

}  // namespace
}  // namespace forge
