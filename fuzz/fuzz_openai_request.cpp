// libFuzzer target: arbitrary bytes as the JSON body of a `forge serve` request
// (serve/openai_api.h), parsed for /v1/completions and for /v1/chat/completions as the server
// parses them. Each parse must give a CompletionRequest or throw ApiError 400 with a non-empty
// one-line message (the server answers it as an OpenAI error object; any other exception is a
// 500, a crash takes the server down). The error object must serialize as the server sends it.
// A request that parses is taken on as the server takes it: the chat messages rendered with the
// built-in ChatML template and encoded with a byte-level tokenizer (encode_chat; a forge::Error
// there is a 400 too, with one line), the completion prompt encoded (encode_text_prompt), the
// sampling settings layered over the defaults and applied (must succeed: the parser checked
// them), and the answer, stream chunk and usage objects serialized and read back unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/generate/sampling_settings.h"
#include "forge/generate/text_prompt.h"
#include "forge/serve/openai_api.h"
#include "fuzz_util.h"

namespace {

using forge::fuzz::require;
using nlohmann::json;
namespace serve = forge::serve;

const forge::tok::Tokenizer& byte_tokenizer() {
  static const forge::tok::Tokenizer t = [] {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
    return forge::tok::Tokenizer::from_bpe(vocab, {}, {{"<|im_start|>", 256}, {"<|im_end|>", 257}},
                                           forge::tok::SplitPattern::kGpt2);
  }();
  return t;
}

// The server's JSON text: invalid UTF-8 replaced, never an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// `j` as the server sends it, read back as a client reads it: must succeed and give `j` again
// (its strings are valid UTF-8: they came from a parsed body).
void round_trip(const char* what, const json& j) {
  forge::fuzz::must_succeed(what, [&] { require(json::parse(dump(j)) == j, what); });
}

// The error object of a refused request: status 400 and a one-line message.
void check_refusal(const serve::ApiError& e) {
  forge::fuzz::require_one_line(e.what());
  require(std::string_view(e.what()).size() <= 1024, "an error message is short (no echo of the body)");
  require(e.status == 400, "a bad request is a 400");
  forge::fuzz::must_succeed("error_json", [&] {
    const json back = json::parse(dump(serve::error_json(e.what(), e.type, e.param, e.code)));
    require(back["error"]["message"].is_string() && !back["error"]["message"].get<std::string>().empty(),
            "the error object has a message");
  });
}

void take_on(const serve::CompletionRequest& r, bool chat) {
  require(r.chat == chat, "the endpoint's kind");
  for (const std::string& s : r.stop) require(!s.empty(), "stop strings are non-empty");
  require(r.stop.size() <= 4, "at most 4 stop strings");
  forge::fuzz::must_succeed("check_sampling", [&] { forge::check_sampling(r.sampling); });
  if (r.sampling.max_new_tokens)
    require(*r.sampling.max_new_tokens >= 0 && *r.sampling.max_new_tokens <= std::numeric_limits<int>::max(),
            "max_tokens fits an int");
  // The request over the server's defaults, as prepare() layers them.
  forge::SamplingOverrides defaults;
  defaults.temperature = 1.0;
  defaults.max_new_tokens = 16;
  forge::fuzz::must_succeed("apply_sampling", [&] { forge::apply_sampling(r.sampling.over(defaults)); });

  const forge::tok::Tokenizer& tok = byte_tokenizer();
  std::string answer;  // what a model might answer: the prompt or the last message back
  if (chat) {
    require(!r.messages.empty(), "a chat has messages");
    for (const forge::chat::Message& m : r.messages)
      require(m.role == "system" || m.role == "user" || m.role == "assistant", "a known role");
    answer = r.messages.back().content;
    static const forge::chat::ChatTemplate chatml = forge::chat::ChatTemplate::chatml();
    forge::chat::RenderOptions ro;
    ro.add_generation_prompt = true;
    ro.now = std::tm{};
    forge::fuzz::expect_ok_or_error([&] {
      const forge::chat::EncodedChat e = forge::chat::encode_chat(chatml, tok, r.messages, ro, "messages");
      require(tok.decode(e.ids) == e.text.text(), "the ids decode to the rendering");
    });
  } else {
    require(r.messages.empty(), "a completion has no messages");
    answer = r.prompt;
    forge::fuzz::expect_ok_or_error([&] {
      const std::vector<int32_t> ids = forge::encode_text_prompt(tok, r.prompt, false, "prompt: ");
      require(!ids.empty() && tok.decode(ids) == r.prompt, "the prompt's ids decode to it");
    });
  }

  const serve::CompletionResult res{answer, "stop", static_cast<int64_t>(answer.size()), 7};
  const std::string model = r.model.value_or("tiny-model");
  forge::fuzz::must_succeed("completion_json", [&] {
    const json whole = serve::completion_json(chat, "cmpl-1", 1700000000, model, res);
    round_trip("completion_json", whole);
    const json& choice = whole["choices"][0];
    require((chat ? choice["message"]["content"] : choice["text"]) == answer, "the answer's text");
    require(whole["usage"]["total_tokens"] == res.prompt_tokens + 7, "the usage adds up");
    round_trip("chunk_json", serve::chunk_json(chat, "cmpl-1", 1700000000, model, answer, "", true));
    round_trip("chunk_json end", serve::chunk_json(chat, "cmpl-1", 1700000000, model, "", "length"));
    round_trip("usage_chunk_json", serve::usage_chunk_json(chat, "cmpl-1", 1700000000, model, res));
    // A streamed piece may end inside a character: the server's dump replaces it.
    if (!answer.empty()) dump(serve::chunk_json(chat, "cmpl-1", 0, model, answer.substr(0, answer.size() - 1)));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (const bool chat : {false, true}) {
    try {
      take_on(serve::parse_completion_request(body, chat), chat);
    } catch (const serve::ApiError& e) {
      check_refusal(e);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "fuzz: std::bad_alloc: a size from the input was trusted\n");
      std::abort();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz: escaped exception (not a 400 ApiError): %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
