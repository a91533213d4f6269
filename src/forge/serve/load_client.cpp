#include "forge/serve/load_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "forge/core/error.h"

namespace forge::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Outcome {
  bool ok = false, mismatch = false;
  std::string why;  // when not ok
  int64_t completion_tokens = 0, prompt_tokens = 0;
  double latency_ms = 0, ttft_ms = -1;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string excerpt(const std::string& s) {
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

void check_text(Outcome& o, const LoadCase& c, const std::string& text) {
  if (c.expected && text != *c.expected) {
    o.mismatch = true;
    o.why = str("the answer ", json(text).dump(-1, ' ', false, json::error_handler_t::replace),
                " is not the expected ",
                json(*c.expected).dump(-1, ' ', false, json::error_handler_t::replace));
    return;
  }
  o.ok = true;
}

void read_usage(Outcome& o, const json& u) {
  o.completion_tokens = u.at("completion_tokens").get<int64_t>();
  o.prompt_tokens = u.at("prompt_tokens").get<int64_t>();
}

Outcome whole(httplib::Client& cli, const std::string& path, const httplib::Headers& h,
              const std::string& body, const LoadCase& c) {
  Outcome o;
  const auto t0 = Clock::now();
  auto r = cli.Post(path, h, body, "application/json");
  o.latency_ms = ms_since(t0);
  if (!r) {
    o.why = str("no answer (", httplib::to_string(r.error()), ")");
    return o;
  }
  if (r->status != 200) {
    o.why = str("HTTP ", r->status, ": ", excerpt(r->body));
    return o;
  }
  try {
    const json j = json::parse(r->body);
    const json& choice = j.at("choices").at(0);
    const std::string text = c.chat ? choice.at("message").at("content").get<std::string>()
                                    : choice.at("text").get<std::string>();
    read_usage(o, j.at("usage"));
    check_text(o, c, text);
  } catch (const std::exception& e) {
    o.why = str("a malformed answer (", e.what(), "): ", excerpt(r->body));
  }
  return o;
}

Outcome streamed(httplib::Client& cli, const std::string& path, const httplib::Headers& h,
                 const std::string& body, const LoadCase& c) {
  Outcome o;
  std::string buf, text, bad;
  bool finished = false, usage = false, done = false;
  const auto t0 = Clock::now();
  auto on_event = [&](const std::string& ev) {
    if (ev.rfind("data: ", 0) != 0) {
      bad = "an event without 'data: ': " + excerpt(ev);
      return false;
    }
    const std::string data = ev.substr(6);
    if (data == "[DONE]") {
      done = true;
      return true;
    }
    if (done) {
      bad = "an event after [DONE]";
      return false;
    }
    const json j = json::parse(data);
    if (j.contains("error")) {
      bad = "an error event: " + excerpt(data);
      return false;
    }
    if (j.contains("usage") && !j["usage"].is_null()) {
      usage = true;
      read_usage(o, j["usage"]);
    }
    const json& choices = j.at("choices");
    if (choices.empty()) return true;
    const json& ch = choices.at(0);
    const std::string piece =
        c.chat ? ch.at("delta").value("content", "") : ch.at("text").get<std::string>();
    if (!piece.empty() && o.ttft_ms < 0) o.ttft_ms = ms_since(t0);
    text += piece;
    if (!ch.at("finish_reason").is_null()) finished = true;
    return true;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = h;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t cut;
    try {
      while (bad.empty() && (cut = buf.find("\n\n")) != std::string::npos) {
        const std::string ev = buf.substr(0, cut);
        buf.erase(0, cut + 2);
        if (!on_event(ev)) break;
      }
    } catch (const std::exception& e) {
      bad = str("a malformed chunk (", e.what(), ")");
    }
    return true;  // read to the end either way: the connection closes cleanly
  };
  auto r = cli.send(req);
  o.latency_ms = ms_since(t0);
  if (!r) {
    o.why = str("no answer (", httplib::to_string(r.error()), ")");
  } else if (r->status != 200) {
    o.why = str("HTTP ", r->status, ": ", excerpt(buf));
  } else if (!bad.empty()) {
    o.why = bad;
  } else if (!done || !finished || !usage || !buf.empty()) {
    o.why = str("an incomplete stream (finish_reason ", finished ? "seen" : "missing", ", usage ",
                usage ? "seen" : "missing", ", [DONE] ", done ? "seen" : "missing", ")");
  } else {
    check_text(o, c, text);
  }
  return o;
}

}  // namespace

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto n = static_cast<double>(values.size());
  const size_t rank = static_cast<size_t>(std::max(1.0, std::ceil(q * n)));
  return values[std::min(values.size(), rank) - 1];
}

LoadResult run_load(const LoadOptions& opt, const std::vector<LoadCase>& cases) {
  if (cases.empty()) throw Error("load client: no requests to make (no cases)");
  if (opt.clients < 1 || opt.requests < 1)
    throw Error("load client: clients and requests must be at least 1");
  if (opt.max_tokens < 1) throw Error("load client: max_tokens must be at least 1");
  httplib::Headers headers;
  if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);
  std::vector<std::string> bodies;
  for (const LoadCase& c : cases)
    for (const bool stream : {false, true}) {
      json b = {{"max_tokens", opt.max_tokens}, {"temperature", opt.temperature}};
      if (c.chat)
        b["messages"] = json::array({json{{"role", "user"}, {"content", c.prompt}}});
      else
        b["prompt"] = c.prompt;
      if (stream) {
        b["stream"] = true;
        b["stream_options"] = {{"include_usage", true}};
      }
      bodies.push_back(b.dump());
    }

  std::vector<Outcome> out(static_cast<size_t>(opt.requests));
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min(opt.clients, opt.requests); ++t)
    threads.emplace_back([&] {
      httplib::Client cli(opt.host, opt.port);
      cli.set_connection_timeout(opt.timeout_s, 0);
      cli.set_read_timeout(opt.timeout_s, 0);
      cli.set_write_timeout(opt.timeout_s, 0);
      for (int i; (i = next++) < opt.requests;) {
        // Whole and streamed in turn, each case twice in a row: every pair of requests holds a
        // stream, and each case is asked both ways.
        const size_t k = (static_cast<size_t>(i) / 2) % cases.size();
        const bool stream = i % 2 == 1;
        const LoadCase& c = cases[k];
        const std::string path = c.chat ? "/v1/chat/completions" : "/v1/completions";
        const std::string& body = bodies[2 * k + (stream ? 1 : 0)];
        out[static_cast<size_t>(i)] =
            stream ? streamed(cli, path, headers, body, c) : whole(cli, path, headers, body, c);
      }
    });
  for (std::thread& t : threads) t.join();

  LoadResult r;
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> latency, ttft;
  for (size_t i = 0; i < out.size(); ++i) {
    const Outcome& o = out[i];
    latency.push_back(o.latency_ms);
    if (o.ttft_ms >= 0) ttft.push_back(o.ttft_ms);
    r.completion_tokens += o.completion_tokens;
    r.prompt_tokens += o.prompt_tokens;
    if (o.ok) {
      ++r.ok;
      continue;
    }
    ++r.failed;
    if (o.mismatch) ++r.mismatched;
    if (static_cast<int>(r.failures.size()) < opt.max_failures)
      r.failures.push_back(
          str("request ", i, ": ", o.why, " after ", static_cast<int64_t>(o.latency_ms), " ms"));
  }
  r.tokens_per_s = r.wall_s > 0 ? static_cast<double>(r.completion_tokens) / r.wall_s : 0;
  r.latency_p50_ms = quantile(latency, 0.5);
  r.latency_p99_ms = quantile(latency, 0.99);
  r.ttft_p50_ms = quantile(ttft, 0.5);
  r.ttft_p99_ms = quantile(ttft, 0.99);
  return r;
}

}  // namespace forge::serve
