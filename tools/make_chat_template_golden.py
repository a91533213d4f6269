#!/usr/bin/env python3
"""Writes the reference data of Forge's chat-template tests (tests/chat/), rendered by Python's
jinja2 the way transformers' apply_chat_template renders:

  tests/data/chat/golden_renders.json
      {"now": ..., "conversations": {name: [messages]}, "cases": [
         {"model", "conversation", "add_generation_prompt",
          "text" (the render) | "error" (the template refused: raise_exception or a TypeError),
          "tokenizer", "ids"}]}
      for every model under tests/data/chat/models/ (a tokenizer_config.json with the real chat
      template, see tests/data/chat/README.md) and every conversation below, with
      add_generation_prompt false and true.
  tests/data/chat/jinja_cases.json
      [{"template", "context", "text" | "error"}]: small templates that pin the interpreter's
      semantics (whitespace control, scoping, loops, filters, tests, operators, undefined).
  tests/data/chat/tokenizers/bytelevel.json
      a byte-level BPE trained here (Hugging Face `tokenizers`) with the ChatML and Llama 3
      special tokens, for the ids of the ChatML and Llama 3 templates.
  tests/data/chat/tokenizers/mistral_v3.json
      tests/data/tokenizer/sentencepiece/mistral.json with [INST] and [/INST] added as special
      tokens, as Mistral v0.3's vocabulary has them.

The environment is transformers' _compile_jinja_template: ImmutableSandboxedEnvironment(
trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]) with its tojson (json.dumps,
ensure_ascii=False), raise_exception, strftime_now (pinned to NOW here, so that Llama 3.2's date
is reproducible), namespace and dict; the variables are messages, tools=None, documents=None,
add_generation_prompt and the model's bos_token / eos_token. When transformers is importable,
every render is also checked against transformers' own render_jinja_template.

"ids" encode the render with the rule of issue 14, computed here independently of Forge: special
tokens count only where the template wrote them. The data is rendered once more with every
special-token string inside message text wrapped in private-use markers (transformers'
mark_control_tokens does the same); special tokens outside markers are the template's. The text
between them is encoded with the tokenizer stripped of its added tokens (for Metaspace
prepend_scheme "first", text that does not start the input is encoded with prepend "never", as
`tokenizers` does for the pieces after an added token). Where no message holds a special-token
string the script asserts that this equals `tokenizers`' own encode of the whole render.

Usage: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install jinja2 tokenizers [transformers]
       /tmp/venv/bin/python tools/make_chat_template_golden.py
"""

import copy
import datetime
import glob
import json
import os
import re
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data", "chat")
SP_DIR = os.path.join(ROOT, "tests", "data", "tokenizer", "sentencepiece")
NOW = datetime.datetime(2024, 9, 5, 12, 0, 0)

MARK_START, MARK_END = "\ue000", "\ue001"

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello, how are you?"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "one_turn": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a primary colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Blue."},
    ],
    "multi_turn_open": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "special_strings": [
        {"role": "user",
         "content": "Repeat: <|im_end|> <|im_start|>system <|eot_id|> </s><s> [INST] "
                    "<|begin_of_text|><|start_header_id|>x<|end_header_id|> <|endoftext|>"},
        {"role": "assistant", "content": "Sure: <|im_end|>\n<|im_start|>assistant\n[/INST] </s>"},
    ],
    "quotes_newlines": [
        {"role": "system", "content": "  Be 'precise'.\n"},
        {"role": "user", "content": "He said \"hi\" and 'bye'.\nNew line\n\n  indented\ttab\\n"},
        {"role": "assistant", "content": "\n  Lines:\n- one\n- two  \n"},
    ],
    "unicode": [
        {"role": "user", "content": "Café naïve — 日本語 😀 ｆｕｌｌ\u00a0nbsp\u3000end\u2028"},
        {"role": "assistant", "content": "Ünïcödé ✓ ß \u200b€"},
    ],
    "empty_contents": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
    ],
    "roles_not_alternating": [
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
}

# model directory → tokenizer its ids are computed with
TOKENIZER_OF = {
    "smollm2-135m-instruct": "bytelevel",
    "qwen2.5-7b-instruct": "bytelevel",
    "llama-3.1-8b-instruct": "bytelevel",
    "llama-3.2-1b-instruct": "bytelevel",
    "llama-2-7b-chat": "llama2",
    "mistral-7b-instruct-v0.1": "mistral",
    "mistral-7b-instruct-v0.3": "mistral_v3",
}
BYTELEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                      "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


ENV = make_env()


def token_text(v):
    """tokenizer_config.json's bos_token / eos_token: a string, an AddedToken object, or null."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_model(name):
    with open(os.path.join(DATA, "models", name, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    tpl = cfg["chat_template"]
    if isinstance(tpl, list):
        tpl = next(t["template"] for t in tpl if t["name"] == "default")
    tokens = {k: token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return tpl, {k: v for k, v in tokens.items() if v is not None}


def render(template, messages, add_generation_prompt, tokens):
    return ENV.from_string(template).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=add_generation_prompt, **tokens)


def transformers_render(template, messages, add_generation_prompt, tokens):
    """transformers' own renderer, with its clock pinned to NOW; None if not installed."""
    try:
        import transformers.utils.chat_template_utils as ctu
    except ImportError:
        return None

    class FixedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return NOW

    ctu.datetime = FixedDatetime
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages], chat_template=template,
        add_generation_prompt=add_generation_prompt, **tokens)
    return rendered[0]


# ---------------------------------------------------------------------------------------------
# Tokenizers


def corpus():
    docs = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(path) and not os.path.splitext(path)[1]:
            with open(path, encoding="utf-8", errors="replace") as f:
                docs += [d.strip("\n") for d in f.read().split("\n%\n") if d.strip()]
    if not docs:
        for path in sorted(glob.glob("/usr/share/common-licenses/*")):
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    docs += [p for p in f.read().split("\n\n") if p.strip()]
    if not docs:
        sys.exit("no training text: apt-get install fortunes")
    # Chat words, so that merges exist for what the templates write.
    chat = ["user", "assistant", "system", "Cutting Knowledge Date: December 2023",
            "Today Date: 26 Jul 2024", "You are Qwen, created by Alibaba Cloud.",
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face", "\n\n", "\n"]
    return docs + chat * 50


def train_bytelevel(path):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=BYTELEVEL_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t.train_from_iterator(corpus(), trainer)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(json.loads(t.to_str()), indent=1, ensure_ascii=False) + "\n")


def write_mistral_v3(path):
    with open(os.path.join(SP_DIR, "mistral.json"), encoding="utf-8") as f:
        j = json.load(f)
    next_id = max(j["model"]["vocab"].values()) + 1
    for k, content in enumerate(["[INST]", "[/INST]"]):
        j["added_tokens"].append({"id": next_id + k, "content": content, "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(j, indent=1, ensure_ascii=False) + "\n")


def tokenizer_paths():
    return {
        "bytelevel": os.path.join(DATA, "tokenizers", "bytelevel.json"),
        "llama2": os.path.join(SP_DIR, "llama2.json"),
        "mistral": os.path.join(SP_DIR, "mistral.json"),
        "mistral_v3": os.path.join(DATA, "tokenizers", "mistral_v3.json"),
    }


class Encoder:
    """Encodes with the rule: special tokens only where the template wrote them."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        self.full = Tokenizer.from_str(json.dumps(j))
        self.specials = {a["content"]: a["id"] for a in j["added_tokens"]}
        plain = copy.deepcopy(j)
        plain["added_tokens"] = []
        self.plain_first = Tokenizer.from_str(json.dumps(plain))
        pre = plain.get("pre_tokenizer") or {}
        if pre.get("type") == "Metaspace" and pre.get("prepend_scheme") == "first":
            plain["pre_tokenizer"]["prepend_scheme"] = "never"
        self.plain_rest = Tokenizer.from_str(json.dumps(plain))

    def ordinary(self, text, starts_input):
        if not text:
            return []
        t = self.plain_first if starts_input else self.plain_rest
        return t.encode(text, add_special_tokens=False).ids

    def encode_marked(self, marked):
        """`marked`: a render whose message text has its special-token strings wrapped in
        markers. Returns (text without markers, ids)."""
        clean, protected, i = [], [], 0
        for piece in re.split(f"({MARK_START}|{MARK_END})", marked):
            if piece == MARK_START:
                start = i
            elif piece == MARK_END:
                protected.append((start, i))
            else:
                clean.append(piece)
                i += len(piece)
        text = "".join(clean)
        by_length = sorted(self.specials, key=len, reverse=True)
        ids, begin, pos = [], 0, 0
        while pos < len(text):
            hit = next((s for s in by_length if text.startswith(s, pos)), None)
            if hit is None or any(a <= pos < b for a, b in protected):
                pos += 1
                continue
            ids += self.ordinary(text[begin:pos], begin == 0)
            ids.append(self.specials[hit])
            pos += len(hit)
            begin = pos
        ids += self.ordinary(text[begin:], begin == 0)
        return text, ids


def mark(messages, specials):
    pattern = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))
    out = []
    for m in messages:
        out.append({k: pattern.sub(lambda x: MARK_START + x.group(0) + MARK_END, v)
                    for k, v in m.items()})
    return out


# ---------------------------------------------------------------------------------------------
# Interpreter cases: (template, context). The expected text or error comes from jinja2.

JINJA_CASES = [
    # whitespace control: trim_blocks, lstrip_blocks, -, +
    ("a\n  {% if true %}\n  b\n  {% endif %}\n  c  {{ 'd' }}  \n", {}),
    ("{% if true %}x{% endif %}\ny", {}),
    ("{%- if true -%}\n  x  \n{%- endif -%}\n  y", {}),
    ("a  {{- ' b ' -}}  c", {}),
    ("x {%+ if true %}y{% endif +%}\nz", {}),
    ("  {# comment #}\nafter", {}),
    ("a {#- comment -#} b", {}),
    ("line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n", {}),
    ("trailing newline kept? no\n", {}),
    ("two trailing\n\n", {}),
    ("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("\t{% if true %}tab{% endif %}", {}),
    ("text {% if true %}\n  inline{% endif %}", {}),
    # loops and loop variables
    ("{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {"items": ["a", "b", "c"]}),
    ("{% for x in items %}{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('o', 'e') }};"
     "{% endfor %}", {"items": [1, 2, 3]}),
    ("{% for x in items if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}",
     {"items": [1, 2, 3, 4]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for x in [1] if false %}x{% else %}filtered{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}"
     "{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}"
     "{{ loop.index }};{% endfor %}", {}),
    # scoping and namespace
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}", {}),
    ("{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set ns = namespace() %}{% set ns.flag = true %}{{ ns.flag }}", {}),
    ("{% set a, b = [1, 2] %}{{ b }}{{ a }}", {}),
    ("{% set t = 1, 2 %}{{ t }}", {}),
    ("{% set block %}in {{ 'block' }}{% endset %}[{{ block }}]", {}),
    ("{% set messages = messages[1:] %}{{ messages | length }}", {"messages": [1, 2, 3]}),
    # expressions and operators
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }}", {}),
    ("{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456.75 }} {{ 3.0 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ u }}", {}),
    ("{{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ 'x' * 3 }} {{ 3 * 'y' }} {{ [0] * 2 }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} "
     "{{ true == 1 }} {{ 'a' != 'b' }}", {}),
    ("{{ 'a' in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'cat' }}", {}),
    ("{{ not true }} {{ true and 'x' }} {{ false or 'y' }} {{ 0 or '' }} {{ none and 1 }}", {}),
    ("{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'x' if false }}]", {}),
    ("{{ (1, 2) }} {{ (1,) }} {{ () }} {{ [1, 'a', none, true, 1.5, {'k': \"v'\"}] }}", {}),
    ("{{ {'a': 1, 'b': [2]} }} {{ {} }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}", {}),
    ("{{ 'a' 'b' \"c\" }} {{ 'tab\\there' }} {{ 'nl\\n' }} {{ '\\x41\\u00e9\\U0001F600' }} "
     "{{ 'back\\\\slash' }} {{ 'keep\\q' }}", {}),
    ("{{ -3 }} {{ +3 }} {{ -(2 + 3) }} {{ - 1.5 }}", {}),
    ("{{ 'abc'[1] }} {{ 'abc'[-1] }} {{ [1, 2, 3][1:] }} {{ [1, 2, 3][::-1] }} {{ 'héllo'[1:3] }} "
     "{{ 'abcdef'[::2] }} {{ [1, 2, 3][-2:] }} {{ [1, 2, 3][:-1] }} {{ 'abc'[5:] }}", {}),
    ("{{ d.a }} {{ d['a'] }} {{ d.missing }}|{{ l[0] }} {{ l.0 }} {{ l[5] }}|", {"d": {"a": 1}, "l": ["x"]}),
    ("{{ d['items'] }}", {"d": {"items": 3}}),
    ("{{ x.y }}|{{ x.z }}", {"x": {"y": None}}),
    ("{{ none }} {{ true }} {{ True }} {{ False }} {{ None }}", {}),
    # undefined
    ("[{{ u }}] {{ u is defined }} {{ u is undefined }} {{ u | length }} {{ u | default('d') }} "
     "[{{ u | trim }}] [{{ u | string }}] {{ u is none }} {{ u == u }} {{ not u }}", {}),
    ("{% for x in u %}x{% endfor %}{% if u %}y{% endif %}[{{ u | join(',') }}][{{ u | list }}]", {}),
    ("{{ u | first }}|{{ [] | first }}|{{ u is iterable }} {{ u is sequence }}", {}),
    ("{{ u.attr }}", {}),
    ("{{ u['k'] }}", {}),
    ("{{ 'a' + u }}", {}),
    ("{{ u() }}", {}),
    ("{{ u | tojson }}", {}),
    ("{{ none.attr }}", {}),
    # filters
    ("[{{ '  x y  ' | trim }}] [{{ 'xxaxx' | trim('x') }}] {{ 'abc' | length }} {{ [1, 2] | count }} "
     "{{ {'a': 1} | length }} {{ 'héllo' | length }}", {}),
    ("{{ none | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} "
     "{{ 0 | d('zero', boolean=true) }}", {}),
    ("{{ [3, 1] | first }} {{ 'abc' | last }} {{ [1, 2] | join(', ') }} {{ 'abc' | join('-') }} "
     "{{ [{'n': 'a'}, {'n': 'b'}] | join('+', attribute='n') }}", {}),
    ("{{ 5 | string }} {{ [1] | string }} {{ '5' | int + 1 }} {{ 'x' | int }} {{ '3.7' | int }} "
     "{{ 'x' | int(7) }} {{ '0x1A' | int(base=16) }} {{ 2.9 | int }} {{ true | int }} "
     "{{ '1e3' | float }} {{ 'a' | float }} {{ 3 | float }}", {}),
    ("{{ 'abc' | list }} {{ {'a': 1} | list }} {{ (1, 2) | list }} {{ 'Hello' | upper }} "
     "{{ 'Hello' | lower }} {{ 'hello wORLD-foo (bar' | title }} {{ 'aBC dEF' | capitalize }}", {}),
    ("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ {'a': 1} | items | list }}", {}),
    ("{{ [{'r': 'a', 'x': 1}, {'r': 'b'}] | selectattr('r', 'equalto', 'b') | list }} "
     "{{ [{'r': 'a', 'x': 1}, {'r': 'b'}] | rejectattr('r', 'equalto', 'b') | list }} "
     "{{ [{'x': 0}, {'x': 1}] | selectattr('x') | list }} "
     "{{ [{'type': 'f', 'function': {'n': 1}}] | selectattr('type', 'eq', 'f') | map(attribute='function') | list }}", {}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('even') | list }} "
     "{{ ['a', 'b'] | map('upper') | list }} {{ [{'a': {'b': 1}}] | map(attribute='a.b') | list }} "
     "{{ [{'a': 1}, {}] | map(attribute='a', default=0) | list }} {{ [1, 2] | map('string') | join }}", {}),
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} "
     "{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }} {{ [1, 2, 3] | sum }} {{ [1, 5, 2] | max }} "
     "{{ [4, 2, 8] | min }} {{ ['a', 'B', 'A'] | unique | list }} {{ 'abc' | reverse }} "
     "{{ [1, 2] | reverse | list }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} "
     "{{ 3.7 | round(method='floor') }} {{ '<b>' | safe }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(blank=true) }}", {}),
    # tojson (transformers' version: json.dumps, ensure_ascii=False, key order kept)
    ("{{ {'b': 1, 'a': [1, 2.5, none, true, 'x\"y\\\\z\\n']} | tojson }}", {}),
    ("{{ d | tojson }} {{ d | tojson(indent=2) }}", {"d": {"z": [1, {"c": "ü"}], "a": {}, "e": []}}),
    ("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ 'é\u2028\x7f\x01\ttab' | tojson }} "
     "{{ 'é😀' | tojson(ensure_ascii=true) }} {{ 1.0 | tojson }} {{ [] | tojson(indent=2) }} "
     "{{ [1, 2] | tojson(separators=(',', ':')) }} {{ 'x' | tojson(indent='\\t') }}", {}),
    ("{{ t | tojson(indent=4) }}", {"t": {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City, e.g. \"Paris\""}},
            "required": ["location"]}}}}),
    # tests
    ("{{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} "
     "{{ 'a' is iterable }} {{ 1 is number }} {{ true is number }} {{ 1.5 is number }} "
     "{{ true is boolean }} {{ 1 is boolean }} {{ [] is sequence }} {{ 'x' is sequence }} "
     "{{ 1 is integer }} {{ 1.0 is float }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}", {}),
    ("{{ 3 is equalto 3 }} {{ 'a' is in 'abc' }} {{ 3 is eq 3 }} {{ 3 is ne 4 }} {{ 1 is lt 2 }} "
     "{{ 2 is ge 2 }} {{ 'x' is not none }} {{ none is not none }} {{ 'ab' is lower }} "
     "{{ 'AB' is upper }} {{ true is true }} {{ 0 is false }} {{ raise_exception is callable }}", {}),
    ("{{ namespace(a=1) is mapping }} {{ {} is sameas {} }} {{ none is sameas none }}", {}),
    # string and dict methods
    ("[{{ '  x  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '  x  '.lstrip() }}] "
     "[{{ '  x  '.rstrip() }}] [{{ '\u3000x\u00a0'.strip() }}]", {}),
    ("{{ 'a  b'.split(' ') }} {{ '  a b  '.split() }} {{ ' a b c '.split(none, 1) }} "
     "{{ 'a,b,c'.split(',', 1) }} {{ 'a\\tb\\nc'.split() }} {{ ''.split() }} {{ ''.split(',') }}", {}),
    ("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'Hello'.upper() }} "
     "{{ 'Hello'.lower() }} {{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }}", {}),
    ("{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} "
     "{{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'aXbXc'.count('X') }} {{ '-'.join(['a', 'b']) }}", {}),
    ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 7) }} {{ d.keys() | list }} "
     "{{ d.values() | list }} {{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{{ '</think>'.join(['a', 'b']) }} {{ 'x</think>y'.split('</think>')[-1] }}", {}),
    # globals
    ("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }} {{ dict(a=1) }} "
     "{{ dict(a=1).a }} {{ namespace(a=1).a }}", {}),
    ("{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}", {}),
    # errors (the text of jinja2's message is not compared, only that it fails)
    ("{{ raise_exception('custom failure') }}", {}),
    ("line1\n{% if %}", {}),
    ("{{ x | nosuchfilter }}", {}),
    ("{{ x is nosuchtest }}", {}),
    ("{% for x in y %}", {}),
    ("{% if true %}{% endfor %}", {}),
    ("{{ 'unterminated }}", {}),
    ("{{ 1 + }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 7 // 0 }}", {}),
    ("{{ none | length }}", {}),
    ("{% for x in none %}{% endfor %}", {}),
    ("{{ 'a' in none }}", {}),
    ("{% set a, b = [1] %}", {}),
    ("{% break %}", {}),
    ("{# never closed", {}),
]


def jinja_case(template, context):
    try:
        return {"template": template, "context": context,
                "text": ENV.from_string(template).render(**context)}
    except Exception as e:  # noqa: BLE001: any failure is an expected error
        return {"template": template, "context": context, "error": f"{type(e).__name__}: {e}"}


def main():
    os.makedirs(os.path.join(DATA, "tokenizers"), exist_ok=True)
    paths = tokenizer_paths()
    train_bytelevel(paths["bytelevel"])
    write_mistral_v3(paths["mistral_v3"])
    encoders = {k: Encoder(p) for k, p in paths.items()}

    cases = []
    checked_with_transformers = 0
    for name in sorted(os.listdir(os.path.join(DATA, "models"))):
        template, tokens = load_model(name)
        enc = encoders[TOKENIZER_OF[name]]
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (False, True):
                case = {"model": name, "conversation": conv_name, "add_generation_prompt": agp}
                try:
                    text = render(template, messages, agp, tokens)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                    cases.append(case)
                    continue
                theirs = transformers_render(template, messages, agp, tokens)
                if theirs is not None:
                    assert theirs == text, (name, conv_name, agp)
                    checked_with_transformers += 1
                marked = render(template, mark(messages, enc.specials), agp, tokens)
                clean, ids = enc.encode_marked(marked)
                assert clean == text, (name, conv_name, agp)
                if not any(s in m["content"] for m in messages for s in enc.specials):
                    assert ids == enc.full.encode(text, add_special_tokens=False).ids, (name, conv_name)
                case.update(text=text, tokenizer=TOKENIZER_OF[name], ids=ids)
                cases.append(case)

    golden = {"now": NOW.isoformat(), "conversations": CONVERSATIONS, "cases": cases}
    with open(os.path.join(DATA, "golden_renders.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    with open(os.path.join(DATA, "jinja_cases.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps([jinja_case(t, c) for t, c in JINJA_CASES], indent=1,
                           ensure_ascii=False) + "\n")
    print(f"{len(cases)} renders ({checked_with_transformers} checked against transformers "
          f"{'(not installed)' if not checked_with_transformers else ''}), "
          f"{len(JINJA_CASES)} interpreter cases")


if __name__ == "__main__":
    main()
