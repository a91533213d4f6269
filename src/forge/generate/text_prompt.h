// Prompt text to ids, and the chat turn's end as a stop condition: shared by `forge generate`
// and `forge serve`, so both encode a prompt and end an assistant turn the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forge/tokenizer/tokenizer.h"

namespace forge {

// As `forge data prepare` encodes documents: a literal special-token string (<|endoftext|>) is
// text unless parse_special reads it as its id; then the special tokens the tokenizer's
// post-processor adds (BOS). Throws forge::Error "<where>the prompt is empty" for no ids.
std::vector<int32_t> encode_text_prompt(const tok::Tokenizer& tokenizer, const std::string& text,
                                        bool parse_special, const std::string& where = "");

// Where a chat template's assistant turn ends (chat::assistant_turn_end): one special token
// stops by id (and adds no text); anything else stops as text. Appends to one of the two lists;
// an empty turn_end adds nothing.
void add_turn_end(const tok::Tokenizer& tokenizer, const std::string& turn_end, std::vector<int32_t>& stop_ids,
                  std::vector<std::string>& stop_strings);

}  // namespace forge
