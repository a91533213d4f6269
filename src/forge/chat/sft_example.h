// Supervised fine-tuning examples: conversations read from JSONL, rendered with the model's chat
// template and encoded to ids with a per-token mask of what is trained.
//
// File format: one JSON object per line (blank lines are skipped), either
//   {"prompt": "...", "response": "..."}                  → user + assistant
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
// Other keys are ignored. A bad line is a forge::Error "FILE:LINE: problem" (not JSON, not an
// object, both forms or neither, a field of the wrong type, an unknown role, no assistant turn).
//
// What is trained: the tokens each assistant turn adds, its content and the template's
// end-of-turn text after it (<|im_end|>, </s>, <|eot_id|>), so the model learns to stop; system
// and user turns and the template's headers are masked. Found without {% generation %} markers,
// which few templates have: for assistant message i, P = render(messages[:i],
// add_generation_prompt=true) and Q = render(messages[:i+1]); Q must start with P and the whole
// conversation's rendering F with Q (a template that is not prefix-stable this way is refused
// with a one-line error naming the example and the turn; Mistral v0.3's, for one, shows the
// system message only inside the last user turn, so with a system message it fails this test).
// The bytes [|P|, |Q|) of F are trained.
//
// Tokens: F is encoded once (chat_encode.h), so the ids are those of the whole conversation, and
// byte ranges are mapped to tokens with token_boundary: exactly wherever a token boundary falls on
// the range's edge. Where BPE merged across the edge (Mistral v0.1 renders "</s> [INST]": the " "
// that ends an assistant turn merges with the "[" after it into "▁[" in Mistral's vocabulary),
// the straddling token counts as trained.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::chat {

struct SftExample {
  std::vector<Message> messages;
  std::string where;  // "FILE:LINE", for errors
};

// One JSONL line (`where` prefixes errors). Throws forge::Error "WHERE: problem".
// require_assistant false accepts a conversation to generate from (forge chat-template).
SftExample parse_sft_line(std::string_view line, const std::string& where,
                          bool require_assistant = true);
// Every example of a file. Throws forge::Error for an unreadable file or the first bad line.
std::vector<SftExample> read_sft_jsonl(const std::string& path, bool require_assistant = true);

struct EncodedChat {
  TaintedString text;  // the rendering that was encoded
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // per token: 1 = an assistant turn's token (trained on)
};

// The conversation rendered (opt.add_generation_prompt as given) and encoded, its assistant
// turns marked as above; `where` prefixes errors. A conversation without assistant messages
// (a prompt to generate from) comes back with nothing trained.
EncodedChat encode_chat(const ChatTemplate& tmpl, const tok::Tokenizer& tok,
                        const std::vector<Message>& messages, const RenderOptions& opt,
                        const std::string& where);
// An SFT example: encode_chat without the generation prompt. Pin opt.now for data that does
// not change with the day (Llama 3.2's template writes today's date through strftime_now).
EncodedChat encode_sft_example(const ChatTemplate& tmpl, const tok::Tokenizer& tok,
                               const SftExample& ex, const RenderOptions& opt = {});

}  // namespace forge::chat
