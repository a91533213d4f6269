#!/usr/bin/env python3
"""Writes tests/data/hf_golden/<name>/generate.json: greedy continuations that `transformers`
generate() produces for the tiny golden models of tools/make_hf_golden.py (std-0.1 weights,
so the argmax is far from ties), for tests/generate/hf_generate_test.cpp: Forge's KV-cache
generation must give the same ids on the CPU and on the GPU.

  {"transformers_version", "torch_version", "max_new_tokens": N,
   "prompts": [[int]...], "generated": [[int] * N ...]}

Three prompts per model, of lengths 7, 7 and 3 (the golden ids and a prefix), so a batch holds
sequences at different positions. EOS is switched off (eos_token_id None) so every continuation
has N ids; the mistral model's sliding window (3) is shorter than every sequence.

Usage: python3 tools/make_hf_generate_golden.py [GOLDEN_DIR [NAME...]]
       (default tests/data/hf_golden, every model in it)
Needs: torch, transformers (runs on the CPU in float32, eager attention).
"""

import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

N = 20


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf_golden")
    only = set(sys.argv[2:])
    for name in sorted(os.listdir(root)):
        if only and name not in only:
            continue
        d = os.path.join(root, name)
        if not os.path.exists(os.path.join(d, "golden.json")):
            continue
        with open(os.path.join(d, "golden.json")) as f:
            ids = json.load(f)["ids"]
        prompts = [ids[0], ids[1], ids[0][:3]]
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        generated = []
        for p in prompts:
            x = torch.tensor([p])
            # An explicit mask: without one generate() masks every prompt id equal to the
            # pad id as padding (prompt 1 starts with id 0).
            with torch.no_grad():
                y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N,
                                   min_new_tokens=N, do_sample=False, eos_token_id=None,
                                   pad_token_id=0, use_cache=True)
            new = y[0, len(p):].tolist()
            assert len(new) == N, (name, len(new))
            generated.append(new)
        out = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "max_new_tokens": N, "prompts": prompts, "generated": generated}
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump(out, f)
        print(f"{name}: {generated}")


if __name__ == "__main__":
    main()
