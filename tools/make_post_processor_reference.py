#!/usr/bin/env python3
"""Writes tests/data/tokenizer/post_processor/: small byte-level BPE tokenizer.json files with
post-processors, and the ids Hugging Face `tokenizers` gives for a few texts with and without
add_special_tokens, for tests/tokenizer/post_processor_test.cpp.

  bos.json       Sequence[ByteLevel, TemplateProcessing "<|begin_of_text|> $A"] (Llama 3's form)
  bos_eos.json   TemplateProcessing "<s> $A </s>" (two special tokens around the text)
  byte_level.json  a ByteLevel post-processor only (adds nothing)
  expected.json  {"<file>": [{"text", "plain", "with_special"}], ...}

Usage: pip install tokenizers
       python3 tools/make_post_processor_reference.py [OUT_DIR]
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello tokenizer. The end of the text is near.",
    "A small corpus for a small vocabulary: the merges learn 'the', 'th', ' t' and friends.",
]
TEXTS = ["Hello world", "the end", "", "<s> inside text"]


def base_tokenizer(specials):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t.train_from_iterator(CORPUS, trainer)
    return t


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        root, "tests", "data", "tokenizer", "post_processor")
    os.makedirs(out, exist_ok=True)

    made = {}
    t = base_tokenizer(["<|begin_of_text|>", "<|end_of_text|>"])
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    made["bos.json"] = t

    t = base_tokenizer(["<s>", "</s>"])
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", t.token_to_id("<s>")), ("</s>", t.token_to_id("</s>"))])
    made["bos_eos.json"] = t

    t = base_tokenizer(["<|endoftext|>"])
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    made["byte_level.json"] = t

    expected = {}
    for name, t in made.items():
        t.save(os.path.join(out, name))
        expected[name] = [{"text": s,
                           "plain": t.encode(s, add_special_tokens=False).ids,
                           "with_special": t.encode(s, add_special_tokens=True).ids}
                          for s in TEXTS]
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
