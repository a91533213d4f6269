#!/usr/bin/env python3
"""The PyTorch side of the training-quality comparison (tools/quality/run.sh): trains a GPT-2
from a Hugging Face model directory (make_init.py) on Forge's token shards with Forge's default
recipe, reading exactly the batches `forge train` reads, in Forge's order.

Data (replicated from src/forge/data/loader.cpp and src/forge/core/rng.cpp, not imported):
  - Training windows: T + 1 consecutive tokens; inputs the first T, targets the last T. Each step
    draws grad_accum x B windows, one after the other, from a Philox4x32-10 stream (seed, stream
    1): a window takes two 32-bit words hi, lo (word n of the stream is word n % 4 of the block
    with counter (n / 4 low 32 bits, n / 4 high 32 bits, stream, 0) and key (seed low, seed
    high)); pick = ((hi << 32) | lo) mod W, W the number of window starts over the train shards
    (train_*.bin in name order, a shard of n tokens has n - T starts, shards without any are
    left out), and pick indexes those starts shard after shard.
  - --seed forge (default): Philox seed = --forge-seed (1337, forge train's default seed), i.e.
    Forge's order; --seed N: Philox seed N, another order of windows drawn the same way (the
    model's initialisation is the directory's either way: only the data order changes).
  - Validation: the first eval_windows windows k = tokens[k*T, k*T + T] (stride T) of the
    val_*.bin shards in name order, in batches of B; the loss is the mean over all their targets.
    Evaluated before step s when s % eval_every == 0 and once after the last step (logged with
    step = steps), as forge train does.
Recipe (src/forge/train/train_config.h, schedule.h, ops/adamw.h, ops/grad_norm.h): lr 6e-4,
linear warm-up over max(1, steps // 20) steps as lr*(s+1)/warmup, cosine to 0.1*lr at the last
step, AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the tensors with >= 2 dimensions
(wte, wpe and the four weight matrices of every block; not biases, not LayerNorm), global-norm
clipping to 1.0 (the norm summed in f64, factor min(1, clip / (norm + 1e-6))), the loss of a
step the mean over its micro-batches.
Precision: fp32 (true fp32: TF32 off, as Forge's --precision fp32) or bf16 = f32 weights, Adam
state and gradients with torch.autocast(bfloat16) around the forward. Forge's bf16 differs in
one way this script cannot copy: Forge keeps every activation, the residual stream included, in
bf16 (llm.c-style), where autocast keeps the residual stream and LayerNorm outputs in f32.

Output: one JSON line per step, the fields of forge train's metrics.jsonl: {"step", "loss", "lr",
"grad_norm", "tokens_per_s"} and "val_loss" on evaluation steps; a last line {"step": steps,
"val_loss"}. The first line is {"meta": {...}} (the settings).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

SHARD_MAGIC = {20240520: np.uint16, 20240801: np.uint32}


# ---- Forge's data order -------------------------------------------------------------------------

def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on arrays of counters (uint64 arrays holding 32-bit values) under one key."""
    M0, M1, W0, W1, mask = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    for _ in range(10):
        p0 = np.uint64(M0) * c0
        p1 = np.uint64(M1) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(mask)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(mask)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0, k1 = (k0 + W0) & mask, (k1 + W1) & mask
    return c0, c1, c2, c3


def philox_words(seed, stream, first, count):
    """Words [first, first + count) of Forge's Rng(seed, stream) (core/rng.cpp) as uint64."""
    b0, b1 = first // 4, (first + count - 1) // 4 + 1
    blocks = np.arange(b0, b1, dtype=np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    r = philox4x32_10(blocks & mask, blocks >> np.uint64(32), np.full(blocks.shape, stream),
                      np.zeros(blocks.shape), seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    words = np.stack(r, axis=1).reshape(-1)  # block-major: word n % 4 of block n / 4
    return words[first - 4 * b0:first - 4 * b0 + count]


def open_shard(path):
    h = np.fromfile(path, dtype=np.int32, count=256)
    if len(h) < 256 or int(h[0]) not in SHARD_MAGIC:
        sys.exit(f"torch_train.py: {path}: not a token shard (llm.c format)")
    toks = np.fromfile(path, dtype=SHARD_MAGIC[int(h[0])], offset=1024)
    if len(toks) != int(h[2]):
        sys.exit(f"torch_train.py: {path}: header says {int(h[2])} tokens, file holds {len(toks)}")
    return toks


def list_shards(data, split):
    if not os.path.isdir(data):
        sys.exit(f"torch_train.py: {data}: not a directory of train_*.bin / val_*.bin shards")
    names = sorted(n for n in os.listdir(data) if n.startswith(split + "_") and n.endswith(".bin"))
    return [open_shard(os.path.join(data, n)) for n in names]


class TrainWindows:
    """Forge's TrainLoader: the window starts of every step, drawn as data/loader.cpp draws them."""
    STREAM = 1  # TrainLoader::kRngStream

    def __init__(self, shards, T, seed):
        self.T, self.seed = T, seed
        self.shards = [s for s in shards if len(s) - T > 0]
        if not self.shards:
            sys.exit(f"torch_train.py: no train shard holds a window of {T + 1} tokens")
        self.cumulative = np.cumsum([len(s) - T for s in self.shards]).astype(np.uint64)
        self.offset = 0  # words consumed (TrainLoader::rng_offset)

    def next_starts(self, n):
        """(shard index, start) of the next n windows."""
        w = philox_words(self.seed, self.STREAM, self.offset, 2 * n)
        self.offset += 2 * n
        picks = ((w[0::2] << np.uint64(32)) | w[1::2]) % self.cumulative[-1]
        r = np.searchsorted(self.cumulative, picks, side="right")  # std::upper_bound
        before = np.where(r == 0, np.uint64(0), self.cumulative[np.maximum(r - 1, 0)])
        return r, (picks - before).astype(np.int64)

    def next_batch(self, n):
        """(n, T + 1) int64 token windows."""
        r, starts = self.next_starts(n)
        return np.stack([self.shards[i][s:s + self.T + 1].astype(np.int64)
                         for i, s in zip(r, starts)])


def val_windows(shards, T, count):
    """The first `count` windows of Forge's EvalWindows, (count, T + 1) int64."""
    out = []
    for s in shards:
        for k in range((len(s) - 1) // T):
            if len(out) == count:
                break
            out.append(s[k * T:k * T + T + 1].astype(np.int64))
    return np.stack(out) if out else np.zeros((0, T + 1), dtype=np.int64)


def lr_at(step, lr, warmup, total, min_frac):
    """train/schedule.h's LrSchedule::at."""
    if step < warmup:
        return lr * (step + 1) / warmup
    min_lr = lr * min_frac
    if total <= warmup:
        return lr
    ratio = min(1.0, max(0.0, (step - warmup) / (total - warmup)))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# ---- the model -----------------------------------------------------------------------------------

def build_model(init_dir, torch):
    """GPT-2 (transformers' GPT2LMHeadModel, computed as nanoGPT writes it) from a HF directory."""
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file

    if not os.path.isfile(os.path.join(init_dir, "config.json")):
        sys.exit(f"torch_train.py: {init_dir}: no config.json (a model directory of make_init.py)")
    cfg = json.load(open(os.path.join(init_dir, "config.json")))
    if cfg.get("model_type") != "gpt2":
        sys.exit(f"torch_train.py: {init_dir}: model_type {cfg.get('model_type')!r}, expected gpt2")
    L, C, H = cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
    V, P, eps = cfg["vocab_size"], cfg["n_positions"], cfg.get("layer_norm_epsilon", 1e-5)
    FF = cfg.get("n_inner") or 4 * C

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=eps), nn.LayerNorm(C, eps=eps)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, FF), nn.Linear(FF, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=eps)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
            return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    model = GPT()
    files = [os.path.join(init_dir, "model.safetensors")]
    index = os.path.join(init_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted({os.path.join(init_dir, f)
                        for f in json.load(open(index))["weight_map"].values()})
    hf = {}
    for f in files:
        for k, t in load_file(f).items():
            hf[k[len("transformer."):] if k.startswith("transformer.") else k] = t.float()
    # HF's Conv1D stores (in, out); nn.Linear (out, in).
    rename = {"attn.c_attn": "c_attn", "attn.c_proj": "attn_proj", "mlp.c_fc": "c_fc",
              "mlp.c_proj": "mlp_proj"}
    state = {}
    for k, t in hf.items():
        if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias") or k == "lm_head.weight":
            continue  # causal-mask buffers of old transformers; the tied head
        for a, b in rename.items():
            if f".{a}." in k:
                k = k.replace(f".{a}.", f".{b}.")
                if k.endswith(".weight"):
                    t = t.t().contiguous()
        state[k] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"torch_train.py: {init_dir}: missing tensors {missing}, unknown {unexpected}")
    return model, cfg


# ---- training -----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True, help="HF GPT-2 model directory (make_init.py)")
    ap.add_argument("--data", required=True, help="forge data prepare's directory")
    ap.add_argument("--out", required=True, help="JSONL file to write")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8, help="B, rows per micro-batch (Forge: 8)")
    ap.add_argument("--seq-len", type=int, default=0, help="T; 0: n_positions (as Forge)")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=-1, help="-1: max(1, steps // 20)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="<= 0: no clipping")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--seed", default="forge",
                    help="window order: 'forge' (Forge's, seed --forge-seed) or an integer")
    ap.add_argument("--forge-seed", type=int, default=1337, help="the forge run's seed")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward + loss")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()

    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    # True fp32 for --precision fp32 (Forge's fp32 GEMMs do not use TF32); under bf16 autocast
    # the GEMMs run in bf16 either way.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    data_seed = a.forge_seed if a.seed == "forge" else (int(a.seed) if a.seed.isdigit() else -1)
    if not 0 <= data_seed < 2 ** 64:
        sys.exit("torch_train.py: --seed must be 'forge' or an integer in [0, 2^64)")
    dev = torch.device(a.device)
    model, cfg = build_model(a.init, torch)
    model = model.to(dev).train()
    T = a.seq_len if a.seq_len > 0 else cfg["n_positions"]
    if T > cfg["n_positions"]:
        sys.exit(f"torch_train.py: --seq-len {T} exceeds n_positions {cfg['n_positions']}")
    B, GA = a.batch, a.grad_accum
    train_shards = list_shards(a.data, "train")
    if not train_shards:
        sys.exit(f"torch_train.py: {a.data}: no train_*.bin shards")
    windows = TrainWindows(train_shards, T, data_seed)
    val = torch.from_numpy(val_windows(list_shards(a.data, "val"), T, a.eval_windows))
    warmup = a.warmup_steps if a.warmup_steps >= 0 else max(1, a.steps // 20)

    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt_kw = {"fused": True} if dev.type == "cuda" else {"foreach": False}  # ops/adamw.h: foreach=False
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, **opt_kw)
    fwd = torch.compile(model) if a.compile else model
    autocast = (torch.autocast(dev.type, dtype=torch.bfloat16) if a.precision == "bf16"
                else torch.autocast(dev.type, enabled=False))

    def to_dev(w):
        w = w.to(dev, non_blocking=True)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def evaluate():
        if len(val) == 0:
            return float("nan")
        model.eval()
        total = 0.0
        with torch.no_grad(), autocast:
            for i in range(0, len(val), B):
                x, y = to_dev(val[i:i + B])
                total += fwd(x, y).item() * len(x)  # the batch's mean, weighted by its windows
        model.train()
        return total / len(val)

    out = open(a.out, "w")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    emit({"meta": {"init": a.init, "data": a.data, "steps": a.steps, "batch": B, "seq_len": T,
                   "grad_accum": GA, "lr": a.lr, "warmup_steps": warmup,
                   "min_lr_frac": a.min_lr_frac, "weight_decay": a.weight_decay,
                   "betas": [a.beta1, a.beta2], "eps": a.eps, "grad_clip": a.grad_clip,
                   "seed": a.seed, "data_seed": data_seed, "precision": a.precision,
                   "device": str(dev), "compile": a.compile, "torch": torch.__version__,
                   "params": sum(p.numel() for p in params)}})
    t_start = time.time()
    for step in range(a.steps):
        rec = {"step": step}
        if step % a.eval_every == 0:
            rec["val_loss"] = evaluate()
        t0 = time.time()
        batch = torch.from_numpy(windows.next_batch(GA * B))  # the whole step's windows first
        losses = []
        for micro in range(GA):
            x, y = to_dev(batch[micro * B:(micro + 1) * B])
            with autocast:
                loss = fwd(x, y)
            (loss / GA).backward()
            losses.append(loss.detach())
        loss_sum = float(torch.stack(losses).double().mean())
        # The global norm accumulated in f64 as Forge does (ops/grad_norm.h; torch's
        # clip_grad_norm_ sums in f32: 6e-6 to 1e-4 off on a 2-layer test model), then Forge's
        # clipping factor min(1, clip / (norm + 1e-6)), none when clip <= 0.
        grads = [p.grad for p in params]
        norm = float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])))
        if a.grad_clip > 0 and a.grad_clip / (norm + 1e-6) < 1:
            torch._foreach_mul_(grads, a.grad_clip / (norm + 1e-6))
        lr = lr_at(step, a.lr, warmup, a.steps, a.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.time() - t0
        rec.update({"loss": loss_sum, "lr": lr, "grad_norm": norm,
                    "tokens_per_s": GA * B * T / max(dt, 1e-9)})
        emit(rec)
        if step % 100 == 0 or step + 1 == a.steps:
            print(f"step {step + 1}/{a.steps} | loss {loss_sum:.4f} | lr {lr:.2e} | norm {norm:.3f}"
                  f" | {rec['tokens_per_s']:.0f} tok/s"
                  + (f" | val {rec['val_loss']:.4f}" if "val_loss" in rec else ""), flush=True)
    final = evaluate()
    emit({"step": a.steps, "val_loss": final})
    print(f"done in {time.time() - t_start:.1f} s: val loss {final:.4f}", flush=True)


if __name__ == "__main__":
    main()
