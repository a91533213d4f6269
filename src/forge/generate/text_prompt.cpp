#include "forge/generate/text_prompt.h"

#include "forge/core/error.h"

namespace forge {

std::vector<int32_t> encode_text_prompt(const tok::Tokenizer& tokenizer, const std::string& text,
                                        bool parse_special, const std::string& where) {
  std::vector<int32_t> ids =
      tokenizer.with_special_tokens(parse_special ? tokenizer.encode(text) : tokenizer.encode_ordinary(text));
  if (ids.empty()) throw Error(str(where, "the prompt is empty"));
  return ids;
}

void add_turn_end(const tok::Tokenizer& tokenizer, const std::string& turn_end, std::vector<int32_t>& stop_ids,
                  std::vector<std::string>& stop_strings) {
  if (turn_end.empty()) return;
  const std::vector<int32_t> end_ids = tokenizer.encode(turn_end);
  if (end_ids.size() == 1 && tokenizer.is_special(end_ids[0]))
    stop_ids.push_back(end_ids[0]);
  else
    stop_strings.push_back(turn_end);
}

}  // namespace forge
