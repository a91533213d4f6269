// A small Jinja interpreter written for chat templates: it renders the templates of Hugging Face
// tokenizer_config.json files exactly as transformers' apply_chat_template does with Python's
// jinja2 (an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols;
// globals raise_exception, strftime_now, namespace, dict, range; its own tojson filter).
//
// Why our own: Debian 12 packages no C++ Jinja engine (`apt-cache search jinja` lists the Python
// jinja2 and its plugins, Emacs and R modes, and Rust's tera sources), and a vendored one would
// be third-party source in the repository. Chat templates need a small part of Jinja, and we need
// one thing no engine offers: the output knows which of its bytes came from the template's own
// text and which from the messages (TaintedString), so that only the template can produce special
// tokens.
//
// What is supported: {{ }}, {% if/elif/else %}, {% for ... in ... [if ...] %} with {% else %},
// loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/cycle,
// {% break %}/{% continue %}, {% set %} (names, tuples, namespace attributes, {% set x %}...
// {% endset %}), {% generation %} (rendered as is), comments, whitespace control, jinja2's
// scoping (a loop body's assignments stay in the loop), the operators, filters, tests and
// string/dict methods chat templates use (jinja_builtins.h). Macros, includes, call blocks and
// filter blocks are not: no template we target uses them, and a template that does fails with a
// one-line error naming the tag.
//
// Errors (syntax, unknown filter or test, raise_exception, undefined values used, type errors)
// are forge::Error with one line: "<name> line <N>: <problem>".
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "forge/chat/jinja_ast.h"
#include "forge/chat/jinja_value.h"
#include "forge/chat/tainted_string.h"

namespace forge::chat::jinja {

struct RenderInput {
  // The template's variables: messages, add_generation_prompt, bos_token, ...
  std::vector<std::pair<std::string, Value>> variables;
  // The time strftime_now formats (tests pin it); default: the local time when rendering.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Throws forge::Error "<name> line N: ..." for a syntax error or an unknown filter or test.
  static Template parse(std::string_view source, std::string name = "chat template");
  TaintedString render(const RenderInput& input) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const Body> body_;
};

// JSON → template value; every string, number and container gets `origin`. Keys keep their order.
Value from_json(const nlohmann::ordered_json& j, int32_t origin);

}  // namespace forge::chat::jinja
