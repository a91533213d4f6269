// `forge serve`: a model directory behind the OpenAI HTTP API (serve/openai_api.h), on
// cpp-httplib. Routes: GET /health, GET /v1/models, POST /v1/completions, POST
// /v1/chat/completions (the model's chat template; built-in ChatML without one), with
// "stream": true answered as server-sent events (one chunk per piece of text, then [DONE]),
// GET /metrics (Prometheus text: serve/metrics.h).
//
// Continuous batching (serve/scheduler.h): HTTP connections are handled on httplib's thread
// pool; each request is a Job for the one scheduler thread, which decodes up to max_batch of
// them together and admits waiting ones between two steps. When max_batch + max_queue requests
// are already in the server, a new one gets 503 (an OpenAI error object, type "server_error",
// code "server_overloaded"). A streaming client that hangs up frees its slot at the next step;
// a non-streamed one is noticed only when its answer is written (httplib 0.11 cannot tell).
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
  std::string api_key;            // non-empty: /v1/* and /metrics need "Authorization: Bearer <key>"
  size_t max_body = 1 << 20;      // bytes; a larger body gets 413
  bool log = true;                // the per-request line on stderr
  int max_batch = 0;              // slots decoded together; 0: 8 on the CPU, 32 on CUDA
  int max_queue = 64;             // requests waiting for a slot; beyond: 503
  int context = 0;                // KV cache tokens per slot (prompt + answer); 0: the model's context
  bool pipeline = true;           // hand out a step's ids while the next step runs (generate/decode_loop.h)
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
  int max_batch() const;  // the decode slots
  int context() const;    // tokens per slot

  // While held, the scheduler admits and decodes nothing (requests wait, then get 503 once the
  // queue is full): for tests that need a known queue. Releasing resumes.
  void hold(bool on);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::serve
