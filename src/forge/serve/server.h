// `forge serve`: a model directory behind the OpenAI HTTP API (serve/openai_api.h), on
// cpp-httplib. Routes: GET /health, GET /v1/models, POST /v1/completions, POST
// /v1/chat/completions (the model's chat template; built-in ChatML without one), with
// "stream": true answered as server-sent events (one chunk per piece of text, then [DONE]).
//
// Requests are served one at a time: HTTP connections are accepted concurrently, but a mutex
// holds the engine for one generation at a time (continuous batching is not built yet).
// Bad requests get an OpenAI error object and 400 (401 without the API key, 404 for an unknown
// path, 413 for a body over max_body); the server keeps serving. One line per request goes to
// stderr: method, path, status, prompt+completion tokens, milliseconds.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace forge::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port (start() returns the one bound)
  std::string device = "cpu";     // cpu or cuda
  std::string precision = "bf16";  // CUDA compute dtype
  std::string api_key;            // non-empty: /v1/* needs "Authorization: Bearer <key>"
  size_t max_body = 1 << 20;      // bytes; a larger body gets 413
  bool log = true;                // the per-request line on stderr
};

class Server {
 public:
  // Loads the model directory (weights, tokenizer.json — required —, chat template,
  // generation_config.json) onto the device. forge::Error for a bad directory or device.
  Server(const std::string& model_dir, ServeOptions opt);
  ~Server();  // stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and serves on a background thread; returns the bound port. forge::Error
  // when the address cannot be bound.
  int start();
  // Blocks until stop() (from another thread) or a fatal listen error.
  void wait();
  // Stops accepting, finishes what is in flight, joins the thread. Idempotent.
  void stop();

  // The model's id in /v1/models and in answers: the model directory's name.
  const std::string& model_name() const;
  std::string device_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::serve
