#!/usr/bin/env python3
"""Loads a model directory that Forge saved with `transformers` and checks it computes what Forge
computes: the export check of DESIGN.md ("what Forge saves, transformers loads").

    forge validate MODELDIR --ids 1,2,3,4 --logits forge_logits.json
    python3 tools/check_hf_export.py MODELDIR --forge-logits forge_logits.json

Prints the model class, the parameter count and logits statistics; with --forge-logits (the JSON
`forge validate --logits` writes: {"ids": [...], "logits": [[V floats] * T]}) compares the two
logits element by element and exits 1 when max |hf - forge| > atol + rtol * |hf| anywhere.
Ids may also be given on the command line (then they must match the file's, if any).

Runs on the CPU in float32 with eager attention. Needs torch and transformers.
"""

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("ids", nargs="*", type=int, help="token ids (default: the logits file's)")
    ap.add_argument("--forge-logits", help="JSON from forge validate --logits")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    args = ap.parse_args()

    forge = None
    ids = args.ids
    if args.forge_logits:
        with open(args.forge_logits) as f:
            forge = json.load(f)
        if ids and ids != forge["ids"]:
            sys.exit(f"ids {ids} differ from the logits file's {forge['ids']}")
        ids = forge["ids"]
    if not ids:
        sys.exit("no token ids: give them on the command line or with --forge-logits")

    model = AutoModelForCausalLM.from_pretrained(args.model_dir).float().eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    n_params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    print(f"{type(model).__name__} from {args.model_dir}: {n_params} parameters, "
          f"tied={model.config.tie_word_embeddings}")
    print(f"logits {tuple(logits.shape)}: mean {logits.mean():.6f} std {logits.std():.6f} "
          f"min {logits.min():.6f} max {logits.max():.6f}")
    print("argmax per position:", logits.argmax(-1).tolist())
    if forge is None:
        return 0

    theirs = torch.tensor(forge["logits"], dtype=torch.float32)
    if theirs.shape != logits.shape:
        print(f"FAIL: forge logits have shape {tuple(theirs.shape)}, transformers {tuple(logits.shape)}")
        return 1
    diff = (theirs - logits).abs()
    bound = args.atol + args.rtol * logits.abs()
    bad = (diff > bound).nonzero().tolist()
    worst = int(diff.argmax())
    t, v = divmod(worst, logits.shape[1])
    print(f"max |forge - hf| = {diff.max():.3e} at position {t}, token {v} "
          f"(hf {logits[t, v]:.6f}, forge {theirs[t, v]:.6f}); "
          f"max relative {(diff / logits.abs().clamp_min(1e-6)).max():.3e}")
    if bad:
        print(f"FAIL: {len(bad)} of {diff.numel()} logits differ beyond atol {args.atol} + "
              f"rtol {args.rtol}; first: {bad[:5]}")
        return 1
    print("OK: transformers reproduces Forge's logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
