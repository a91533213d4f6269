// forge serve: a model directory behind an OpenAI-compatible HTTP API (serve/server.h).
#include <cstdio>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/serve/server.h"

namespace forge::cli {

namespace {

const Command kServe = {
    "serve",
    "serve a model over an OpenAI-compatible HTTP API",
    {{"model", "DIR", "model directory (with tokenizer.json); its name is the model id"},
     {"host", "ADDR", "address to listen on (default 127.0.0.1: this machine only)"},
     {"port", "N", "TCP port (default 8080; 0 = any free port, printed)"},
     {"device", "D", "cpu (default) or cuda"},
     {"precision", "P", "CUDA compute dtype: bf16 (default), fp16 or fp32"},
     {"api-key", "KEY", "require 'Authorization: Bearer KEY' on /v1/* and /metrics (else 401)"},
     {"max-batch", "N", "requests decoded together (default 8 on cpu, 32 on cuda; at most 1024)"},
     {"max-queue", "N", "requests waiting for a slot beyond those (default 64, at most 1024; more: 503)"},
     {"context", "N", "KV cache tokens per request, prompt + answer (default: the model's context)"},
     {"max-body", "BYTES", "largest request body accepted (default 1048576; larger: 413)"}},
    false,
    "",
    "GET / is a chat page (open http://HOST:PORT/ in a browser; served without the API key).\n"
    "Routes: GET /health, GET /v1/models, POST /v1/completions (prompt: a string) and POST\n"
    "/v1/chat/completions (messages rendered by the model's chat template, built-in ChatML\n"
    "without one). Fields: model, max_tokens, temperature, top_p, seed, stop (a string or up to 4),\n"
    "n (1 only), stream (server-sent events, then 'data: [DONE]'), stream_options.include_usage.\n"
    "Defaults: the model's generation_config.json, else temperature 1 and max_tokens 16\n"
    "(completions) or the rest of the context (chat); without a seed each request draws a\n"
    "random one.\n"
    "Continuous batching: up to --max-batch requests decode together, one token each per step;\n"
    "waiting requests join between two steps, and one that ends (or whose streaming client hangs\n"
    "up) frees its slot at once. The KV cache holds max-batch x context tokens, allocated at\n"
    "start. With max-batch + max-queue requests in the server, a new one gets 503 (error type\n"
    "server_error, code server_overloaded). GET /metrics: Prometheus text (requests by status,\n"
    "prompt and generated tokens, queue depth, active slots, tokens/s over the last 10 s).\n"
    "Bad requests get an OpenAI error object and a 4xx status. One line per request is logged\n"
    "to stderr. Stop with Ctrl-C."};

}  // namespace

int cmd_serve(const Argv& argv) {
  const Args a = parse_args(kServe, argv);
  if (a.help()) {
    print_help(kServe);
    return 0;
  }
  serve::ServeOptions o;
  o.host = a.get("host", o.host);
  o.port = a.get_int("port", 8080, 0, 65535);
  o.device = a.get("device", "cpu");
  o.precision = a.get("precision", "bf16");
  o.api_key = a.get("api-key");
  if (a.has("api-key") && o.api_key.empty()) throw Error("--api-key: the key is empty");
  o.max_body = static_cast<size_t>(a.get_int64("max-body", 1 << 20, 1, int64_t{1} << 40));
  o.max_batch = a.get_int("max-batch", 0, 1, 1024);
  o.max_queue = a.get_int("max-queue", 64, 0, 1024);  // each waiting request holds an HTTP thread
  o.context = a.get_int("context", 0, 1, 1 << 24);
  serve::Server server(a.require("model"), o);
  const int port = server.start();
  std::fprintf(stderr, "forge serve: model '%s' on %s, %d slots x %d tokens, listening on http://%s:%d\n",
               server.model_name().c_str(), server.device_name().c_str(), server.max_batch(), server.context(),
               o.host.c_str(), port);
  server.wait();
  return 0;
}

}  // namespace forge::cli
