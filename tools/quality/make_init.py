#!/usr/bin/env python3
"""Writes a randomly initialised GPT-2 as a Hugging Face model directory (config.json +
model.safetensors, f32), made by `transformers` itself: GPT2LMHeadModel(GPT2Config(...)) after
torch.manual_seed(seed), saved with save_pretrained. Both sides of the training-quality
comparison (tools/quality/run.sh) start from it: `forge train --init-from DIR` and
tools/quality/torch_train.py --init DIR.

Defaults: GPT-2 124M (12 layers, width 768, 12 heads, 1,024 positions, vocabulary 50,257, tied
embeddings, GELU tanh, LayerNorm eps 1e-5). Dropout is 0 (Forge has none; transformers'
GPT2Config defaults to 0.1). No tokenizer files: `forge train` then carries those of the --data
directory (`forge data prepare` writes GPT-2's there).

usage: make_init.py --out DIR [--seed 1337] [--layers 12 --width 768 --heads 12 --ctx 1024]
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="model directory to write (must not exist)")
    ap.add_argument("--seed", type=int, default=1337, help="torch.manual_seed before the init")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ctx", type=int, default=1024, help="n_positions")
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"make_init.py: {a.out} already exists; choose another --out")
    if a.width % a.heads:
        sys.exit(f"make_init.py: --width {a.width} does not divide into {a.heads} heads")

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.ctx, n_embd=a.width, n_layer=a.layers,
                     n_head=a.heads, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                     bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(cfg).float()
    model.save_pretrained(a.out)  # safetensors (the only format of transformers 5)
    if not os.path.exists(os.path.join(a.out, "model.safetensors")):
        sys.exit(f"make_init.py: {a.out}/model.safetensors was not written")
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"init": a.out, "params": n, "layers": a.layers, "width": a.width,
                      "heads": a.heads, "ctx": a.ctx, "vocab": a.vocab, "seed": a.seed,
                      "torch": torch.__version__,
                      "transformers": __import__("transformers").__version__}))


if __name__ == "__main__":
    main()
