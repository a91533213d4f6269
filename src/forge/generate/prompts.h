// prompts.jsonl: the requests of one batched generation run, one JSON object per line.
//   {"prompt": "Once upon a time", "max_new_tokens": 50, "stop": ["\n\n", "THE END"]}
//   {"ids": [464, 2068, 7586], "temperature": 0, "seed": 7}
// Each line gives exactly one of "prompt" (text, for the model's tokenizer to encode) and "ids"
// (token ids, non-empty). Optional: "max_new_tokens", "stop" (a string or a list of non-empty
// strings: generation ends before the first one that completes, as OpenAI's stop does), "seed",
// "temperature", "top_k", "top_p", "min_p", "repetition_penalty" (ranges: check_sampling in
// sampling_settings.h); null means "not given". Blank lines (whitespace only) are skipped; a
// trailing "\r" (CRLF files) is dropped.
//
// The whole file is read and checked before anything is generated. Every problem is one
// forge::Error "PATH:LINE: what": malformed JSON, a line that is not an object, invalid UTF-8,
// an unknown or repeated key, a value of the wrong type, a value out of range, an id outside
// the vocabulary (when the caller gives its size), a file without any request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "forge/generate/sampling_settings.h"

namespace forge {

struct PromptRequest {
  int line = 0;                       // 1-based line in the file, for the caller's messages
  std::optional<std::string> prompt;  // the text, when "prompt" was given (may be empty)
  std::vector<int32_t> ids;           // the ids, when "ids" was given; empty otherwise
  std::vector<std::string> stop;      // stop strings, each non-empty; none: []
  SamplingOverrides sampling;         // max_new_tokens, seed and sampler settings as given
};

// Reads and checks `path`. vocab_size > 0: every id must be below it.
std::vector<PromptRequest> read_prompts(const std::string& path, int vocab_size = 0);

// The same for text already in memory; `name` stands for the file in messages.
std::vector<PromptRequest> parse_prompts(std::string_view text, const std::string& name,
                                         int vocab_size = 0);

}  // namespace forge
