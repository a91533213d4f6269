// Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
// messages ending in '\0', commands on the child's fd 3, answers and events on its fd 4), for
// the chat page test. Unlike --dump-dom, whose --virtual-time-budget stops waiting once a
// streamed response's headers are in, the test can poll the page until it says it is done.
// The browser runs in its own process group (child_process.h): the destructor closes it and
// kills whatever of the group is left; every wait has a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "serve/child_process.h"

namespace forge::testing {

class HeadlessChromium {
 public:
  // `extra` are more flags (e.g. --window-size=W,H); stderr goes to log_path.
  HeadlessChromium(const std::string& exe, const std::string& profile_dir,
                   const std::string& log_path, const std::vector<std::string>& extra = {}) {
    ::signal(SIGPIPE, SIG_IGN);  // a browser that died must not kill the test on a write
    int to[2], from[2];
    if (::pipe(to) != 0 || ::pipe(from) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> argv = {exe,
                                     "--headless",
                                     "--no-sandbox",
                                     "--disable-gpu",
                                     "--no-first-run",
                                     "--disable-background-networking",
                                     "--disable-component-update",
                                     "--disable-sync",
                                     "--disable-dev-shm-usage",
                                     "--user-data-dir=" + profile_dir,
                                     "--remote-debugging-pipe"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("about:blank");
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      // The pipe ends to fds 3 (commands in) and 4 (answers out), by way of high numbers so
      // that no dup2 overwrites an end still needed.
      const int in = ::fcntl(to[0], F_DUPFD, 20), out = ::fcntl(from[1], F_DUPFD, 20);
      const int null = ::open("/dev/null", O_RDWR);
      const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || out < 0 || null < 0 || log < 0) ::_exit(126);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(log, 2);
      ::dup2(in, 3);
      ::dup2(out, 4);
      for (int fd = 5; fd < 64; ++fd) ::close(fd);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    to_ = to[1];
    from_ = from[0];
    if (pid_ < 0) throw std::runtime_error("fork failed");
  }
  ~HeadlessChromium() {
    try {
      if (pid_ > 0) send("Browser.close", {}, false);
    } catch (const std::exception&) {
    }
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0) wait_for(pid_, 10);  // then kills the group
  }
  HeadlessChromium(const HeadlessChromium&) = delete;
  HeadlessChromium& operator=(const HeadlessChromium&) = delete;

  // Opens url in a new tab; later calls go to that tab.
  void open(const std::string& url) {
    const nlohmann::json t = call("Target.createTarget", {{"url", url}});
    const nlohmann::json s =
        call("Target.attachToTarget", {{"targetId", t.at("targetId")}, {"flatten", true}});
    session_ = s.at("sessionId").get<std::string>();
  }
  // A command's result; std::runtime_error on an error answer or after timeout_s.
  nlohmann::json call(const std::string& method, const nlohmann::json& params,
                      double timeout_s = 30) {
    const int id = send(method, params, true);
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    for (;;) {
      const nlohmann::json m = receive(end);
      if (!m.contains("id") || m["id"] != id) continue;  // events, other answers
      if (m.contains("error")) throw std::runtime_error(method + ": " + m["error"].dump());
      return m.value("result", nlohmann::json::object());
    }
  }
  // The value of a JavaScript expression in the tab (JSON-serializable values).
  nlohmann::json eval(const std::string& expression) {
    const nlohmann::json r =
        call("Runtime.evaluate", {{"expression", expression}, {"returnByValue", true}});
    if (r.contains("exceptionDetails"))
      throw std::runtime_error("evaluate: " + r["exceptionDetails"].dump());
    return r.at("result").value("value", nlohmann::json());
  }

 private:
  int send(const std::string& method, const nlohmann::json& params, bool in_session) {
    nlohmann::json m = {{"id", next_id_}, {"method", method}, {"params", params}};
    if (in_session && !session_.empty() && method.rfind("Target.", 0) != 0)
      m["sessionId"] = session_;
    const std::string text = m.dump() + '\0';
    for (size_t at = 0; at < text.size();) {
      const ssize_t n = ::write(to_, text.data() + at, text.size() - at);
      if (n <= 0) throw std::runtime_error("chromium closed its pipe");
      at += static_cast<size_t>(n);
    }
    return next_id_++;
  }
  nlohmann::json receive(std::chrono::steady_clock::time_point end) {
    for (;;) {
      const size_t cut = buf_.find('\0');
      if (cut != std::string::npos) {
        const std::string msg = buf_.substr(0, cut);
        buf_.erase(0, cut + 1);
        return nlohmann::json::parse(msg);
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) throw std::runtime_error("chromium did not answer in time");
      pollfd p = {from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[65536];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n <= 0) throw std::runtime_error("chromium closed its pipe");
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int next_id_ = 1;
  std::string buf_, session_;
};

// Standard base64 (a screenshot's PNG bytes).
inline std::string base64_decode(const std::string& in) {
  std::string out;
  int val = 0, bits = -8;
  for (const unsigned char c : in) {
    int d;
    if (c >= 'A' && c <= 'Z')
      d = c - 'A';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      d = c - '0' + 52;
    else if (c == '+')
      d = 62;
    else if (c == '/')
      d = 63;
    else
      continue;  // '=' and line breaks
    val = (val << 6) | d;
    bits += 6;
    if (bits >= 0) {
      out += static_cast<char>((val >> bits) & 0xFF);
      bits -= 8;
    }
  }
  return out;
}

}  // namespace forge::testing
