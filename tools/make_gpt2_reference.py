#!/usr/bin/env python3
"""Writes tests/data/tokenizer/gpt2_reference.json: GPT-2 token ids for a set of texts, as three
independent reference implementations compute them (they must all agree, or the script stops):

  1. tiktoken (OpenAI's Rust BPE), its Encoding built by hand from GPT-2's own encoder.json and
     vocab.bpe (tiktoken would download them otherwise; these are the same files);
  2. Hugging Face `tokenizers`: a BPE model from the same files, ByteLevel pre-tokenizer/decoder;
  3. the algorithm of openai/gpt-2's encoder.py, transcribed below (regex module, bigram loop).

Each entry is {"text": str, "ids": [int], "specials": bool}; specials=true means the ids were
computed with <|endoftext|> recognised as a special token (Forge's encode()); false means it is
plain text (encode_ordinary()).

Usage: pip install tiktoken tokenizers regex
       python3 tools/make_gpt2_reference.py [GPT2_DIR] [OUT_JSON]
GPT2_DIR defaults to ../shared/data/gpt2 relative to the repository root.
"""

import json
import os
import sys

import regex
import tiktoken
import tiktoken.load
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"

TEXTS = [
    # English
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "GPT-2 is a large transformer-based language model with 1.5 billion parameters.",
    # contractions (uppercase ones are not contractions for GPT-2)
    "I'm sure they'll say it's what we've done; you'd think they're right, don't you?",
    "HE'S HERE. IT'S 'S 'T 'RE 'VE 'M 'LL 'D",
    "'s't're've'm'll'd 'x ''s",
    "rock'n'roll isn't ain't y'all'd've",
    # whitespace
    "a  b",
    "a   b\tc\t\td",
    "line1\nline2\n\nline3",
    "trailing spaces   ",
    "\n\n  \n",
    "   leading spaces",
    " ",
    "\t",
    "\r\n\r\n",
    "mixed \t \n whitespace \u00a0 nbsp \u3000 ideographic",
    " " * 300 + "x",
    # digits
    "12345678901234567890",
    "3.14",
    "pi is 3.14159, e is 2.71828, and 1,000,000 is a million.",
    "abc123def 4five6",
    "1" * 400,
    # punctuation runs
    "Wait...!!! ??? --- *** ~~~",
    "(a+b)*[c-d]/{e} == f; g != h && i || j",
    "<html><body><p class=\"x\">Hi</p></body></html>",
    "def foo(x):\n    return x ** 2  # square\n",
    # accents and combining marks
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m",
    "Se\u00f1or ni\u00f1o",
    "e\u0301 cafe\u0301 n\u0303",
    # CJK
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    # emoji, ZWJ sequences, modifiers, flags
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 family",
    "\U0001f642\U0001f642\U0001f642",
    "thumbs \U0001f44d\U0001f3fd flags \U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7",
    # mixed scripts
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440! Hello "
    "\u03ba\u03cc\u03c3\u03bc\u03bf\u03c2 123 \u0645\u0631\u062d\u0628\u0627 "
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "a" * 500,
    "\U00010348\U0001d11e \U000e0041 \uffff\ufffd",
    # <|endoftext|> as plain text (encode_ordinary)
    "Hello<|endoftext|>world",
]

SPECIAL_TEXTS = [
    "Hello<|endoftext|>world",
    "a <|endoftext|> b",
    "<|endoftext|><|endoftext|>",
    "<|endoftext|>",
    "end.\n<|endoftext|>\nThe next document starts here.",
    "<|endoftext|",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class Gpt2EncoderPy:
    """openai/gpt-2 src/encoder.py, transcribed (without its cache)."""

    def __init__(self, encoder, merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.pat = regex.compile(GPT2_PATTERN)

    def bpe(self, token):
        word = tuple(token)
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        if not pairs:
            return [token]
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        return list(word)

    def encode(self, text):
        ids = []
        for token in regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token))
        return ids


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    default_dir = os.path.join(root, "..", "shared", "data", "gpt2")
    gpt2_dir = sys.argv[1] if len(sys.argv) > 1 else default_dir
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests", "data", "tokenizer",
                                                              "gpt2_reference.json")
    encoder_json = os.path.join(gpt2_dir, "encoder.json")
    vocab_bpe = os.path.join(gpt2_dir, "vocab.bpe")

    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)
    tt = tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                           special_tokens={EOT: 50256})

    hf = Tokenizer(models.BPE.from_file(encoder_json, vocab_bpe))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])

    with open(encoder_json, encoding="utf-8") as f:
        encoder = json.load(f)
    with open(vocab_bpe, encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    py = Gpt2EncoderPy(encoder, merges)

    entries = []
    for text in TEXTS:
        a = tt.encode_ordinary(text)
        b = hf.encode(text, add_special_tokens=False).ids if EOT not in text else a
        c = py.encode(text)
        assert a == b == c, (text, a, b, c)
        assert tt.decode(a) == text
        entries.append({"text": text, "ids": a, "specials": False})
    for text in SPECIAL_TEXTS:
        a = tt.encode(text, allowed_special="all")
        b = hf.encode(text, add_special_tokens=False).ids
        assert a == b, (text, a, b)
        entries.append({"text": text, "ids": a, "specials": True})

    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(e, ensure_ascii=True) for e in entries))
        f.write("\n]\n")
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
