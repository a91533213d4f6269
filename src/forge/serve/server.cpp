#include "forge/serve/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/generate/engine.h"
#include "forge/generate/generation_config.h"
#include "forge/generate/text_prompt.h"
#include "forge/generate/text_stream.h"
#include "forge/model/model_dir.h"
#include "forge/serve/chat_page.h"
#include "forge/serve/metrics.h"
#include "forge/serve/openai_api.h"
#include "forge/serve/scheduler.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dir_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "." ? std::filesystem::absolute(dir).lexically_normal().filename().string() : name;
}

// A request ready for the engine.
struct Prepared {
  GenRequest req;
  std::vector<std::string> stop;
};

// JSON text; invalid UTF-8 (a parse error quoting the client's bytes, a path) becomes U+FFFD
// instead of an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* openai_reason(FinishReason r) {
  return r == FinishReason::kLength || r == FinishReason::kContext ? "length" : "stop";
}

}  // namespace

struct Server::Impl {
  ServeOptions opt;
  std::string name;
  ModelConfig cfg;
  GenerationConfig gen_cfg;
  std::optional<tok::Tokenizer> tokenizer;
  std::optional<chat::ChatTemplate> chat_template;
  std::string turn_end;
  std::unique_ptr<Engine> engine;
  Metrics metrics;
  std::unique_ptr<Scheduler> scheduler;  // after engine and metrics: stopped before they go
  httplib::Server http;
  std::thread thread;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopped{false};
  std::atomic<bool> listen_ended{false};
  int listen_fd = -1;  // the listening socket, seen by the socket-options callback

  void log(const httplib::Request& req, int status, int64_t tokens, Clock::time_point t0) const {
    if (!opt.log) return;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::fprintf(stderr, "forge serve: %s %s %d %lld tokens %.1f ms\n", req.method.c_str(), req.path.c_str(), status,
                 static_cast<long long>(tokens), ms);
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_json(e.what(), e.type, e.param, e.code)), "application/json");
  }

  void check_auth(const httplib::Request& req) const {
    if (opt.api_key.empty()) return;
    if (req.get_header_value("Authorization") != "Bearer " + opt.api_key)
      throw ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'", "",
                     "invalid_api_key", "authentication_error");
  }

  Prepared prepare(const CompletionRequest& c) {
    if (c.model && *c.model != name)
      throw ApiError(400, str("model ", quote(*c.model), " is not served here; this server serves ", quote(name)), "model",
                     "model_not_found");
    Prepared p;
    try {
      if (c.chat) {
        chat::RenderOptions ro;
        ro.add_generation_prompt = true;
        p.req.prompt = chat::encode_chat(*chat_template, *tokenizer, c.messages, ro, "messages").ids;
      } else {
        p.req.prompt = encode_text_prompt(*tokenizer, c.prompt, false, "prompt: ");
      }
    } catch (const Error& e) {
      throw ApiError(400, e.what(), c.chat ? "messages" : "prompt", "invalid_value");
    }
    const int64_t n = static_cast<int64_t>(p.req.prompt.size());
    const int context = scheduler->context();  // the model's, or --context
    if (n > context)
      throw ApiError(400, str("the prompt is ", n, " tokens, longer than the context of ", context, " tokens"),
                     c.chat ? "messages" : "prompt", "context_length_exceeded");
    // The request over generation_config.json over OpenAI's defaults (temperature 1; max_tokens
    // 16 for completions, the rest of the context for chat).
    SamplingOverrides defaults;
    defaults.temperature = 1.0;
    defaults.max_new_tokens = c.chat ? std::max<int64_t>(1, context - n) : 16;
    const SamplingOverrides eff = c.sampling.over(gen_cfg.sampling_defaults().over(defaults));
    if (*eff.max_new_tokens > context)
      throw ApiError(400, str("max_tokens: ", *eff.max_new_tokens, " is more than the context of ", context, " tokens"),
                     "max_tokens", "invalid_value");
    p.req.max_new_tokens = static_cast<int>(*eff.max_new_tokens);
    p.req.sampling = apply_sampling(eff);
    if (!c.sampling.seed) p.req.sampling.seed = std::random_device{}() * 4294967296ull + std::random_device{}();
    p.req.stop_ids = gen_cfg.eos_token_ids;
    p.stop = c.stop;
    if (c.chat) add_turn_end(*tokenizer, turn_end, p.req.stop_ids, p.stop);
    return p;
  }

  // Hands the request to the scheduler: ApiError 503 when the server is full.
  std::shared_ptr<Job> submit(Prepared& p) {
    std::shared_ptr<Job> job;
    try {
      job = std::make_shared<Job>(std::move(p.req), *tokenizer, std::move(p.stop));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "stop", "invalid_value");
    }
    if (!scheduler->submit(job))
      throw ApiError(503,
                     str("the server is busy (", scheduler->slots(), " requests decoding and ", opt.max_queue,
                         " waiting, --max-batch and --max-queue): retry later"),
                     "", "server_overloaded", "server_error");
    return job;
  }

  // The job's end as the API answers it (its text pieces already taken); forge::Error when it
  // failed.
  static CompletionResult result_of(const Job& job) {
    const JobResult& j = job.result();
    if (!j.error.empty()) throw Error(j.error);
    CompletionResult r;
    r.text = j.text;
    r.finish_reason = j.stop_string ? "stop" : openai_reason(j.reason);
    r.prompt_tokens = j.prompt_tokens;
    r.completion_tokens = j.completion_tokens;
    return r;
  }

  // Sends `res` an error and counts it.
  void fail(const httplib::Request& req, httplib::Response& res, const ApiError& e, Clock::time_point t0) {
    send_error(res, e);
    if (e.status == 503) res.set_header("Retry-After", "1");  // overload: retry soon, as OpenAI's 503 asks
    metrics.count_request(e.status);
    log(req, e.status, 0, t0);
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto t0 = Clock::now();
    try {
      check_auth(req);
      const CompletionRequest c = parse_completion_request(req.body, chat);
      Prepared p = prepare(c);
      const std::string id = str(chat ? "chatcmpl-" : "cmpl-", next_id++);
      const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
      std::shared_ptr<Job> job = submit(p);
      if (!c.stream) {
        while (job->next()) {
        }
        const CompletionResult r = result_of(*job);
        res.set_content(dump(completion_json(chat, id, created, name, r)), "application/json");
        metrics.count_request(200);
        log(req, 200, r.prompt_tokens + r.completion_tokens, t0);
        return;
      }
      // The job is cancelled when the provider is dropped, also unrun (a client gone before the
      // headers): its slot is freed at the next step either way.
      auto guard = std::shared_ptr<Job>(job.get(), [job](Job*) { job->cancel(); });
      res.set_chunked_content_provider(
          "text/event-stream", [this, guard, chat, id, created, include_usage = c.include_usage, req_copy = req, t0](size_t, httplib::DataSink& sink) {
            Job& job = *guard;
            auto send = [&](const json& j) {
              const std::string ev = "data: " + dump(j) + "\n\n";
              return sink.write(ev.data(), ev.size());
            };
            bool ok = !chat || send(chunk_json(true, id, created, name, "", "", /*role=*/true));
            while (ok) {
              const std::optional<std::string> text = job.next();
              if (!text) break;
              ok = send(chunk_json(chat, id, created, name, *text));
            }
            CompletionResult r;
            if (!ok) {
              job.cancel();
              metrics.count_cancelled();
            } else {
              try {
                r = result_of(job);
              } catch (const std::exception& e) {  // after the 200 is sent: an error event, then the end
                ok = send(error_json(e.what(), "server_error"));
              }
            }
            metrics.count_request(200);
            if (ok && !r.finish_reason.empty()) ok = send(chunk_json(chat, id, created, name, "", r.finish_reason));
            if (ok && !r.finish_reason.empty() && include_usage)
              ok = send(usage_chunk_json(chat, id, created, name, r));
            if (ok) {
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
            }
            sink.done();
            log(req_copy, 200, r.prompt_tokens + r.completion_tokens, t0);
            return true;
          });
      res.set_header("Cache-Control", "no-cache");
    } catch (const ApiError& e) {
      fail(req, res, e, t0);
    } catch (const std::exception& e) {
      fail(req, res, ApiError(500, e.what(), "", "", "server_error"), t0);
    }
  }

  void metrics_route(const httplib::Request& req, httplib::Response& res) {
    const auto t0 = Clock::now();
    try {
      check_auth(req);
      res.set_content(metrics.render(scheduler->slots()), "text/plain; version=0.0.4; charset=utf-8");
      log(req, 200, 0, t0);
    } catch (const ApiError& e) {
      send_error(res, e);
      log(req, e.status, 0, t0);
    }
  }

  void routes() {
    http.set_payload_max_length(opt.max_body);
    // A request holds its HTTP thread while it waits and decodes, so the pool has one for each
    // request the scheduler takes (slots + queue) and a few for the rest (/health, /metrics, the
    // 503s); httplib's default pool (max(8, cores - 1) threads) would cap the batch below
    // --max-batch and queue the rest where no 503 can answer them.
    const size_t handlers = static_cast<size_t>(scheduler->slots()) + static_cast<size_t>(opt.max_queue) + 8;
    http.new_task_queue = [handlers] { return new httplib::ThreadPool(handlers); };
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second server bind a
    // port already served and silently share its connections.
    http.set_socket_options([this](socket_t sock) {
      listen_fd = sock;
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    // The chat page (serve/chat_page.h): no API key, it holds no secret; its API calls need one.
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(chat_page_html(), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(dump(json{{"status", "ok"}}), "application/json");
      log(req, 200, 0, Clock::now());
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      const auto t0 = Clock::now();
      try {
        check_auth(req);
        const json model = {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "forge"}};
        res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
        log(req, 200, 0, t0);
      } catch (const ApiError& e) {
        send_error(res, e);
        log(req, e.status, 0, t0);
      }
    });
    http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) { metrics_route(req, res); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, true); });
    // What httplib answers itself (404 unknown path, 413 body too large, 400 bad HTTP) gets an
    // OpenAI error object too; the routes' own errors already have a body.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                        httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = str("HTTP ", res.status);
      std::string code;
      if (res.status == 404) message = str("no route ", req.method, " ", req.path), code = "not_found";
      if (res.status == 413)
        message = str("the request body is larger than the limit of ", opt.max_body, " bytes (--max-body)"),
        code = "request_too_large";
      res.set_content(dump(error_json(message, "invalid_request_error", "", code)), "application/json");
      log(req, res.status, 0, Clock::now());
      return httplib::Server::HandlerResponse::Handled;
    }));
  }
};

Server::Server(const std::string& model_dir, ServeOptions opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = std::move(opt);
  const Device device = parse_device(m.opt.device);
  if (!std::filesystem::is_directory(model_dir)) throw Error(str(model_dir, ": no such model directory"));
  if (!std::filesystem::exists(model_dir + "/tokenizer.json"))
    throw Error(str(model_dir, ": no tokenizer.json, so text prompts cannot be encoded"));
  Transformer<float> loaded = load_model_dir(model_dir, GradBuffers::kNone);
  m.cfg = loaded.config();
  m.name = dir_name(model_dir);
  m.gen_cfg = load_generation_config(model_dir);
  m.tokenizer = tok::Tokenizer::load(model_dir + "/tokenizer.json");
  m.chat_template = chat::ChatTemplate::load(model_dir);
  m.turn_end = chat::assistant_turn_end(*m.chat_template);
  m.engine = make_engine(std::move(loaded), device, m.opt.precision);
  SchedulerOptions so;
  so.slots = m.opt.max_batch > 0 ? m.opt.max_batch : device == Device::kCuda ? 32 : 8;
  so.capacity = m.opt.context;
  so.max_queue = m.opt.max_queue;
  so.pipeline = m.opt.pipeline;
  m.scheduler = std::make_unique<Scheduler>(*m.engine, m.metrics, so);
  m.routes();
}

Server::~Server() { stop(); }

int Server::start() {
  Impl& m = *impl_;
  int port = m.opt.port;
  if (port == 0) {
    port = m.http.bind_to_any_port(m.opt.host);
    if (port < 0) throw Error(str("cannot bind ", m.opt.host, " to a free port"));
  } else if (!m.http.bind_to_port(m.opt.host, port)) {
    throw Error(str("cannot bind ", m.opt.host, ":", port, " (in use, or not an address of this machine)"));
  }
  // Debian's compiled httplib listens with a backlog of 5: 64 clients connecting at once overflow
  // it, and the kernel drops connections (the load test saw "no answer" after ~1 s). Listening
  // again on the bound socket raises the backlog (Linux: capped by net.core.somaxconn).
  if (m.listen_fd >= 0) ::listen(m.listen_fd, 1024);
  m.thread = std::thread([&m] {
    m.http.listen_after_bind();
    m.listen_ended = true;
  });
  // Until the accept loop runs (or has ended): a stop() before it would be missed and wait() hang.
  while (!m.http.is_running() && !m.listen_ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port;
}

void Server::wait() {
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Server::stop() {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  impl_->http.stop();
  wait();  // the handlers' jobs end first: the scheduler still runs
  impl_->scheduler->stop();
}

const std::string& Server::model_name() const { return impl_->name; }
std::string Server::device_name() const { return impl_->engine->device_name(); }
int Server::max_batch() const { return impl_->scheduler->slots(); }
int Server::context() const { return impl_->scheduler->context(); }
void Server::hold(bool on) { impl_->scheduler->hold(on); }

}  // namespace forge::serve
