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
     {"api-key", "KEY", "require 'Authorization: Bearer KEY' on /v1/* (else 401)"},
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
    "Requests are served one at a time (no batching across requests yet). Bad requests get an\n"
    "OpenAI error object and a 4xx status. One line per request is logged to stderr. Stop with\n"
    "Ctrl-C."};

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
  serve::Server server(a.require("model"), o);
  const int port = server.start();
  std::fprintf(stderr, "forge serve: model '%s' on %s, listening on http://%s:%d\n", server.model_name().c_str(),
               server.device_name().c_str(), o.host.c_str(), port);
  server.wait();
  return 0;
}

}  // namespace forge::cli
