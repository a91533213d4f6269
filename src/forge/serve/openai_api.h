// The OpenAI HTTP API's JSON, as `forge serve` speaks it: a /v1/completions or
// /v1/chat/completions body checked into a CompletionRequest, and the response, stream chunk
// and error objects. No model here: the server (serve/server.h) encodes and generates.
//
// Accepted fields: model, prompt (a string; completions) or messages ([{role, content}] with
// string content; chat), max_tokens (or max_completion_tokens), temperature, top_p, seed, stop
// (a string or a list of up to 4 non-empty strings), n (1 only), stream, stream_options
// ({include_usage}). Fields other clients send
// (user, logprobs, presence_penalty, ...) are ignored whatever their value. A known field of the
// wrong type or out of range, or a body that is not a JSON object, is an ApiError (400).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/generate/sampling_settings.h"

namespace forge::serve {

// An error answered to the client: HTTP status and the OpenAI error object's fields.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param, code, type;
};

// {"error": {"message", "type", "param", "code"}}; an empty param or code is null.
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param = "",
                          const std::string& code = "");

struct CompletionRequest {
  bool chat = false;
  std::optional<std::string> model;
  std::string prompt;                  // completions
  std::vector<chat::Message> messages;  // chat
  SamplingOverrides sampling;           // temperature, top_p, seed, max_new_tokens (max_tokens) as given
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage, no choices
};

// Parses and checks a request body (ApiError 400 naming the field otherwise).
CompletionRequest parse_completion_request(const std::string& body, bool chat);

// OpenAI's finish_reason: "stop" (an end-of-sequence id or a stop string) or "length"
// (max_tokens, or the model's context).
struct CompletionResult {
  std::string text;
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// The whole answer: a text_completion or a chat.completion object.
nlohmann::json completion_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                               const CompletionResult& r);
// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage_json(const CompletionResult& r);
// The chunk stream_options.include_usage asks for last: no choices, the usage.
nlohmann::json usage_chunk_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                                const CompletionResult& r);
// One server-sent chunk: text_completion / chat.completion.chunk. Chat: `role` adds the
// assistant role to the delta (the first chunk); finish_reason null unless given.
nlohmann::json chunk_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                          const std::string& text, const std::string& finish_reason = "", bool role = false);

}  // namespace forge::serve
