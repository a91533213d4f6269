#!/usr/bin/env python3
"""Measures tiktoken and Hugging Face tokenizers on the same inputs as `forge bench tokenizer`,
so the two can be run side by side on one machine. For producing comparison figures only.

What it measures, as forge bench tokenizer does:
  - HF tokenizers BPE training: ByteLevel pre-tokenizer (GPT-2 regex), the 256-byte alphabet,
    --vocab-size tokens including one special <|endoftext|>, with --threads rayon threads;
  - encode throughput of one tokenizer in both libraries, one thread (1 MB blocks one after
    another) and --threads threads (encode_batch / encode_ordinary_batch over the blocks).
The tokenizer to encode with is --tokenizer (a tokenizer.json, or a directory with tokenizer.json
or GPT-2's encoder.json + vocab.bpe) or else the one HF trained here; tiktoken gets the same
vocabulary (rank = id, which is merge order for byte-level BPE vocabularies) and --pattern.

usage: python3 bench/tokenizer_compare.py --input FILE... [--tokenizer PATH] [--vocab-size N]
           [--threads N] [--pattern gpt2|gpt4] [--no-train] [--json-out FILE]
needs: pip install tokenizers tiktoken
"""
import argparse
import json
import os
import sys
import time

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4 = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
        r"""|\s*[\r\n]|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """GPT-2's printable stand-in for every byte (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def blocks_of(texts, size=1 << 20):
    """~1 MB blocks ending at a newline, as forge bench tokenizer cuts them."""
    out = []
    for t in texts:
        start = 0
        while start < len(t):
            end = t.find("\n", min(len(t), start + size))
            end = len(t) if end < 0 else end + 1
            out.append(t[start:end])
            start = end
    return out


def load_vocab(path):
    """(vocab str→id, special tokens str→id, HF Tokenizer) from a tokenizer.json or a GPT-2 dir."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "tokenizer.json")):
            path = os.path.join(path, "tokenizer.json")
        else:
            enc, bpe = os.path.join(path, "encoder.json"), os.path.join(path, "vocab.bpe")
            tok = Tokenizer(models.BPE.from_file(enc, bpe))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            vocab = json.load(open(enc, encoding="utf-8"))
            specials = {k: v for k, v in vocab.items() if k.startswith("<|")}
            return vocab, specials, tok
    tok = Tokenizer.from_file(path)
    j = json.load(open(path, encoding="utf-8"))
    specials = {a["content"]: a["id"] for a in j.get("added_tokens", [])}
    vocab = {k: v for k, v in j["model"]["vocab"].items() if k not in specials}
    return vocab, specials, tok


def tiktoken_encoding(vocab, specials, pattern):
    import tiktoken
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(byte_of[c] for c in token): rank for token, rank in vocab.items()}
    return tiktoken.Encoding("compare", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=specials)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--pattern", choices=["gpt2", "gpt4"], default="gpt2")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.no_train and not a.tokenizer:
        sys.exit("--no-train needs --tokenizer")
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # read when tokenizers starts its pool
    import tiktoken
    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    raw = [open(p, "rb").read() for p in a.input]
    nbytes = sum(len(r) for r in raw)
    mb = nbytes / 1e6
    texts = [r.decode("utf-8", errors="replace") for r in raw]
    res = {"input_files": len(a.input), "input_bytes": nbytes, "threads": a.threads,
           "tokenizers_version": tokenizers.__version__, "tiktoken_version": tiktoken.__version__}

    trained = None
    if not a.no_train:
        trained = Tokenizer(models.BPE())
        trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trained.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        t0 = time.perf_counter()
        trained.train(a.input, trainer)
        res["hf_train_seconds"] = time.perf_counter() - t0
        res["hf_train_vocab_size"] = trained.get_vocab_size()
        path = "/tmp/tokenizer_compare_trained.json"
        trained.save(path)
    if a.tokenizer:
        path = a.tokenizer
    vocab, specials, hf = load_vocab(path)
    tt = tiktoken_encoding(vocab, specials, GPT2 if a.pattern == "gpt2" else GPT4)
    res["tokenizer"] = a.tokenizer or "trained here by HF tokenizers"

    blocks = blocks_of(texts)
    timings = {}
    t0 = time.perf_counter()
    n_tt = sum(len(tt.encode_ordinary(b)) for b in blocks)
    timings["tiktoken_encode_mb_s_1_thread"] = mb / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    tt.encode_ordinary_batch(blocks, num_threads=a.threads)
    timings["tiktoken_encode_mb_s_all_threads"] = mb / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    n_hf = sum(len(hf.encode(b, add_special_tokens=False).ids) for b in blocks)
    timings["hf_encode_mb_s_1_thread"] = mb / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    hf.encode_batch(blocks, add_special_tokens=False)
    timings["hf_encode_mb_s_all_threads"] = mb / (time.perf_counter() - t0)
    res.update(timings)
    res["tokens_tiktoken"], res["tokens_hf"] = n_tt, n_hf

    print(f"input: {len(a.input)} files, {mb:.1f} MB; tokenizer: {res['tokenizer']} "
          f"({len(vocab) + len(specials)} tokens); threads: {a.threads}")
    if "hf_train_seconds" in res:
        print(f"HF tokenizers {tokenizers.__version__} train vocab {res['hf_train_vocab_size']}: "
              f"{res['hf_train_seconds']:.2f} s")
    for k, v in timings.items():
        print(f"{k:36s} {v:8.2f} MB/s")
    if n_tt != n_hf:
        print(f"note: tiktoken gave {n_tt} tokens, HF tokenizers {n_hf}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
