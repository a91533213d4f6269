#!/usr/bin/env python3
"""Writes tests/data/tokenizer/sentencepiece/: SentencePiece-style (character-level BPE with byte
fallback) tokenizer.json files trained with Hugging Face `tokenizers`, and what `tokenizers`
gives for them, for tests/tokenizer/sentencepiece_test.cpp.

  llama2.json    Llama 2's form: BPE byte_fallback + fuse_unk, unk_token <unk>, vocabulary led
                 by <unk> <s> </s> <0x00>..<0xFF>; normalizer Sequence[Prepend("▁"),
                 Replace(" " -> "▁")]; pre_tokenizer null; decoder Sequence[Replace("▁" -> " "),
                 ByteFallback, Fuse, Strip(" ", 1, 0)]; TemplateProcessing "<s> $A". Merges in
                 the old "a b" string form. Trained with no pre-tokenizer, so some merges cross
                 a "▁" (an encoder that splits at spaces gets other ids).
  mistral.json   Mistral's newer form: normalizer null; pre_tokenizer Metaspace(prepend_scheme
                 "first", split false); the same decoder; merges as ["a", "b"] pairs. Trained with
                 a splitting Metaspace (no merge crosses a "▁"), as sentencepiece vocabularies are.
  expected.json  {"variants": [{"name", "base", "patch", "cases", "decodes"}], "tokenizers": V}
                 A variant is a base file with a JSON merge patch (RFC 7386) applied: byte
                 fallback off (unk, fused or not), Metaspace on Llama 2's vocabulary (split or
                 not), prepend "always"/"never", a Metaspace decoder, a lone Replace
                 normalizer, ignore_merges, no post-processor.
                 cases: {"text", "ids" (add_special_tokens=False), "with_special" (True),
                 "ordinary" (the same file without added tokens: special-token text is text),
                 "decode" (decode(ids, skip_special_tokens=False)), "round_trips"}.
                 decodes: {"ids", "text"} for id sequences chosen to hit ByteFallback's rules:
                 valid and invalid UTF-8 byte runs, byte runs next to other tokens, special
                 tokens, a leading space, and seeded random sequences over the whole vocabulary.

The training text is English from the `fortunes` package (/usr/share/games/fortunes; Debian:
apt-get install fortunes), falling back to /usr/share/common-licenses. The vocabularies are small
(800) and the alphabet limited, so characters of the training text miss the vocabulary too and
byte fallback is exercised by English as well as by CJK and emoji.

Usage: pip install tokenizers
       python3 tools/make_sp_tokenizer_reference.py [OUT_DIR]
"""

import copy
import glob
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = ["<0x%02X>" % b for b in range(256)]
VOCAB_SIZE = 800
LIMIT_ALPHABET = 72  # fortunes have ~95 distinct characters; the rarer ones fall back to bytes

FORTUNE_FILES = ["fortunes", "computers", "humorists", "science", "wisdom", "literature",
                 "people", "work", "education", "linux"]

LONG = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
        "was the season of Light, it was the season of Darkness, it was the spring of hope, it "
        "was the winter of despair, we had everything before us, we had nothing before us, we "
        "were all going direct to Heaven, we were all going direct the other way.")

TEXTS = [
    # English
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's what we've done; you'd think they're right, don't you?",
    LONG,
    LONG + "\n\n" + LONG.upper(),  # > 256 bytes: Forge's long-piece merge path
    # whitespace
    "a  b",
    "runs    of     spaces",
    "  two leading spaces",
    " one leading space",
    "trailing spaces   ",
    " ",
    "   ",
    " " * 300 + "x",
    "line one\nline two\n\nline four\n",
    "\n",
    "\r\n\r\n",
    "tab\tseparated\tvalues",
    "\t leading tab",
    "mixed \t \n whitespace \u00a0 nbsp \u3000 ideographic",
    # digits and punctuation the limited alphabet may lack
    "digits 0123456789 and 3.14159, 1,000,000",
    "2024-01-15 12:34:56",
    "curly {braces} ~tilde~ |pipe| `backtick` [brackets] <angle> #hash @at ^caret",
    # accented Latin, other scripts, emoji
    "Café naïve façade résumé — déjà vu",
    "Ünïcödé ÀÉÎÕÜ ß ø å",
    "中文测试",
    "日本語のテキスト 한국어 Ελληνικά Русский",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧 family",
    "“smart quotes” and ‘single’ … ellipsis",
    "\u2581",  # the meta-space character itself
    "\u2581\u2581hello \u2581 world",
    "xyzzy plugh xyzzy xyzzy.",
    "",
    # special tokens in text
    "<s>",
    "<s>Hello",
    "Hello <s> world",
    " <s> ",
    "a</s>b",
    "<unk>",
    "text with <s> inside and </s> too",
    "<s><s></s>",
    "< s> <s ><<s>>",
]


def corpus():
    docs = []
    for name in FORTUNE_FILES:
        path = os.path.join("/usr/share/games/fortunes", name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                docs += [d.strip("\n") for d in f.read().split("\n%\n") if d.strip()]
    if not docs:
        for path in sorted(glob.glob("/usr/share/common-licenses/*")):
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    docs += [p for p in f.read().split("\n\n") if p.strip()]
    if not docs:
        sys.exit("no training text: apt-get install fortunes")
    return docs


def sp_decoder():
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                              decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])


def bos_processor(t):
    bos = t.token_to_id("<s>")
    return processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                         special_tokens=[("<s>", bos)])


def train(docs, pre_tokenizer, normalizer):
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer = normalizer
    t.pre_tokenizer = pre_tokenizer
    # The byte tokens go in as specials so that they get ids 3..258 and take part in no merge;
    # finish() makes them ordinary vocabulary entries, as in Llama 2's file.
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS + BYTE_TOKENS,
                                  limit_alphabet=LIMIT_ALPHABET, show_progress=False)
    t.train_from_iterator(docs, trainer)
    return t


def finish(t, pre_tokenizer, legacy_merges):
    """tokenizer.json text: byte tokens out of added_tokens, the wanted pre-tokenizer."""
    t.pre_tokenizer = pre_tokenizer
    t.decoder = sp_decoder()
    t.post_processor = bos_processor(t)
    j = json.loads(t.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in SPECIALS]
    if legacy_merges:
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    for i, s in enumerate(SPECIALS):
        assert j["model"]["vocab"][s] == i
    for b, s in enumerate(BYTE_TOKENS):
        assert j["model"]["vocab"][s] == 3 + b
    return json.dumps(j, indent=1, ensure_ascii=False) + "\n"


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


METASPACE_DECODER = {"type": "Metaspace", "decoders": None, "replacement": "▁",
                     "prepend_scheme": "always", "split": True}
VARIANTS = [
    ("llama2", "llama2.json", {}),
    ("llama2_unk_fused", "llama2.json", {"model": {"byte_fallback": False}}),
    ("llama2_unk_unfused", "llama2.json", {"model": {"byte_fallback": False, "fuse_unk": False}}),
    # Llama 2's vocabulary has merges across "▁", so splitting before each "▁" changes ids.
    ("llama2_metaspace_first", "llama2.json",
     {"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                                             "prepend_scheme": "first", "split": False}}),
    ("llama2_metaspace_first_split", "llama2.json",
     {"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                                             "prepend_scheme": "first", "split": True},
      "post_processor": None}),
    ("mistral", "mistral.json", {}),
    ("metaspace_always_split", "mistral.json",
     {"pre_tokenizer": {"prepend_scheme": "always", "split": True},
      "decoder": METASPACE_DECODER}),
    # Tokens no merge makes, so that ignore_merges changes ids ("▁xyzzy" whole, not in pieces).
    ("metaspace_never_ignore_merges", "mistral.json",
     {"pre_tokenizer": {"prepend_scheme": "never", "split": True},
      "decoder": dict(METASPACE_DECODER, prepend_scheme="never"),
      "model": {"ignore_merges": True, "vocab": {"▁xyzzy": VOCAB_SIZE, "xyzzy": VOCAB_SIZE + 1}}}),
    ("replace_only", "mistral.json",
     {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
      "pre_tokenizer": None,
      "decoder": {"decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                               {"type": "ByteFallback"}, {"type": "Fuse"}]}}),
]


def decode_ids(t, rng):
    """Id sequences for decode(): byte-token runs valid and not, next to other tokens."""
    vocab = t.get_vocab()

    def ids(*tokens):
        return [vocab[s] for s in tokens]

    out = [
        [],
        ids("<0xE4>", "<0xB8>", "<0xAD>"),  # 中: a valid run
        ids("<0xE4>", "<0xB8>"),  # cut short
        ids("<0xE4>", "<0xB8>", "<0xAD>", "<0xE4>"),  # valid then cut: the whole run is invalid
        ids("<0xFF>"),
        ids("<0x80>", "<0x41>"),
        ids("<0xC3>", "<0xA9>", "<0x41>"),  # é A
        ids("<0xED>", "<0xA0>", "<0x80>"),  # a surrogate: not UTF-8
        ids("<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "<0xF0>", "<0x9F>"),
        ids("▁the", "<0xE4>", "<0xB8>", "▁the", "<0xE4>", "<0xB8>", "<0xAD>"),
        ids("<0xC3>", "▁the", "<0xA9>"),
        ids("<0x20>", "▁the"),  # a leading space from a byte token
        ids("<0x20>", "<0x20>", "▁the"),
        ids("▁", "▁", "▁the"),
        ids("▁", "▁the", "▁"),
        ids("<s>", "▁the"),
        ids("<s>", "<0xE4>", "</s>"),
        ids("</s>", "<unk>", "<s>"),
        ids("<unk>", "▁the", "<unk>"),
    ]
    n = t.get_vocab_size()
    for length in [1, 2, 3, 5, 8, 13, 21, 34] * 3:
        out.append([rng.randrange(n) for _ in range(length)])
    # Byte tokens only: random runs, mostly invalid, some valid by chance.
    for length in [1, 2, 3, 4, 6]:
        for _ in range(3):
            out.append([3 + rng.choice([0x41, 0x20, 0x0A, 0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0,
                                        0x9F, 0x98, 0x80, 0xFF]) for _ in range(length)])
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        root, "tests", "data", "tokenizer", "sentencepiece")
    os.makedirs(out, exist_ok=True)
    docs = corpus()

    files = {}
    llama = train(docs, None, normalizers.Sequence([normalizers.Prepend("▁"),
                                                    normalizers.Replace(" ", "▁")]))
    files["llama2.json"] = finish(llama, None, legacy_merges=True)
    mistral = train(docs, pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True),
                    None)
    files["mistral.json"] = finish(
        mistral, pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False),
        legacy_merges=False)
    for name, text in files.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(text)

    rng = random.Random(1234)
    variants = []
    for name, base, patch in VARIANTS:
        j = merge_patch(json.loads(files[base]), patch)
        t = Tokenizer.from_str(json.dumps(j))
        no_added = Tokenizer.from_str(json.dumps(dict(j, added_tokens=[])))
        cases = []
        for s in TEXTS:
            ids = t.encode(s, add_special_tokens=False).ids
            text = t.decode(ids, skip_special_tokens=False)
            cases.append({"text": s, "ids": ids,
                          "with_special": t.encode(s, add_special_tokens=True).ids,
                          "ordinary": no_added.encode(s, add_special_tokens=False).ids,
                          "decode": text, "round_trips": text == s})
        if j["model"].get("ignore_merges"):  # the data must show what the flag does
            j["model"]["ignore_merges"] = False
            merging = Tokenizer.from_str(json.dumps(j))
            assert any(merging.encode(s).ids != c["ids"] for s, c in zip(TEXTS, cases)), name
        decodes = [{"ids": ids, "text": t.decode(ids, skip_special_tokens=False)}
                   for ids in decode_ids(t, rng)]
        variants.append({"name": name, "base": base, "patch": patch, "cases": cases,
                         "decodes": decodes})
        fallback = sum(any(3 <= i < 259 for i in c["ids"]) for c in cases)
        unk = sum(0 in c["ids"] for c in cases)
        print(f"{name}: {len(cases)} texts ({fallback} with byte tokens, {unk} with <unk>), "
              f"{sum(c['round_trips'] for c in cases)} round-trip, {len(decodes)} decodes")

    # One case per line: small diffs when the data is remade.
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        f.write('{"tokenizers": %s,\n "variants": [\n' % json.dumps(tokenizers.__version__))
        for k, v in enumerate(variants):
            f.write(' {"name": %s, "base": %s, "patch": %s,\n  "cases": [\n' % (
                json.dumps(v["name"]), json.dumps(v["base"]),
                json.dumps(v["patch"], ensure_ascii=False)))
            f.write(",\n".join("   " + json.dumps(c, ensure_ascii=False) for c in v["cases"]))
            f.write('],\n  "decodes": [\n')
            f.write(",\n".join("   " + json.dumps(d, ensure_ascii=False) for d in v["decodes"]))
            f.write("]}" + ("," if k + 1 < len(variants) else "") + "\n")
        f.write("]}\n")
    print("wrote", out, "with tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
