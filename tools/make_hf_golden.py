#!/usr/bin/env python3
"""Writes tests/data/hf_golden/<name>/: tiny random Hugging Face models and what `transformers`
computes with them, for tests/model/hf_golden_test.cpp (Forge must load each directory and
reproduce the logits, the loss and every parameter's gradient norm).

Each directory holds what save_pretrained writes (config.json, model.safetensors in float32,
generation_config.json) and golden.json:
  {"name", "transformers_version", "torch_version",
   "batch": B, "seq_len": T, "vocab_size": V,
   "ids": [[int] * T] * B,                 fixed token ids
   "logits": [[[float] * V] * T] * B,      model(ids).logits
   "loss": float,                          model(ids, labels=ids).loss (labels shifted inside)
   "grad_norms": {hf_name: float}}         ||d loss / d p||_2 for every named parameter

The models: llama with grouped-query attention (untied head), llama tied, gpt2 (Conv1D
weights, learned positions, biases), mistral with a sliding window of 3 < T = 7; and the
Llama-shaped families of issue 13: qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm, head_dim 16
while hidden/heads is 8), llama with attention_bias (q/k/v/o biases) and an explicit head_dim,
llama with RoPE scaling of type llama3 (head size 16 so the three wavelength regimes all occur:
unchanged, blended, divided), linear and dynamic; smollm3 with its second layer without RoPE. V = 100 is
not a multiple of 64, so Forge's padded-vocabulary path is exercised. Weights are drawn with
std 0.1 (larger than the usual 0.02, so logits are far from uniform) and norm gains and
biases are perturbed away from 1 and 0, so a swapped or ignored tensor changes the numbers.

Everything runs on the CPU in float32 with eager attention: deterministic, no GPU needed.
Total size is about 0.7 MB.

Usage: python3 tools/make_hf_golden.py [OUT_DIR [NAME...]]   (default tests/data/hf_golden, all)
Models are drawn in the order of configs() from one generator, so writing only some NAMEs gives
them the same weights as a full run (and leaves the other directories alone).
Needs: torch, transformers (written against transformers 5.x / torch 2.x; works with 4.4x).
"""

import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)

V5 = int(transformers.__version__.split(".")[0]) >= 5


def rope(theta, **scaling):
    """RoPE settings in this transformers version's dialect: rope_parameters (5.x) or
    rope_theta + rope_scaling (4.x)."""
    if V5:
        return {"rope_parameters": {"rope_type": scaling.pop("rope_type", "default"),
                                    "rope_theta": theta, **scaling}}
    out = {"rope_theta": theta}
    if scaling:
        out["rope_scaling"] = scaling
    return out

B, T, V = 2, 7, 100
SEED = 1234


def configs():
    common_llama = dict(vocab_size=V, max_position_embeddings=32, num_hidden_layers=2,
                        hidden_act="silu", attention_bias=False, mlp_bias=False)
    return {
        "llama_gqa_untied": (LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, **common_llama)),
        "llama_tied": (LlamaForCausalLM, LlamaConfig(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, **common_llama)),
        "gpt2": (GPT2LMHeadModel, GPT2Config(
            vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=None,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)),
        "mistral_sliding_window": (MistralForCausalLM, MistralConfig(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
            sliding_window=3, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
            tie_word_embeddings=False, attention_dropout=0.0)),
        "qwen2_bias": (Qwen2ForCausalLM, Qwen2Config(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            use_sliding_window=False, tie_word_embeddings=True, attention_dropout=0.0,
            **rope(1000000.0))),
        "qwen3_qk_norm": (Qwen3ForCausalLM, Qwen3Config(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False,
            tie_word_embeddings=False, attention_dropout=0.0, **rope(1000000.0))),
        "llama_attention_bias": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5, hidden_act="silu", attention_bias=True, mlp_bias=False,
            tie_word_embeddings=False, **rope(10000.0))),
        "llama3_rope_scaling": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, max_position_embeddings=256, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
            **rope(500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64))),
        "llama_linear_rope": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, max_position_embeddings=128, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5,
            hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
            **rope(10000.0, rope_type="linear", factor=4.0))),
        "llama_dynamic_rope": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5,
            hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
            **rope(10000.0, rope_type="dynamic", factor=2.0))),
        "smollm3_no_rope": (SmolLM3ForCausalLM, SmolLM3Config(
            vocab_size=V, max_position_embeddings=32, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            hidden_act="silu", attention_bias=False, mlp_bias=False, use_sliding_window=False,
            no_rope_layers=[1, 0], tie_word_embeddings=True, attention_dropout=0.0,
            pad_token_id=None, bos_token_id=None, eos_token_id=None,
            **rope(10000.0))),
    }


def use_eager(model):
    """Eager attention, whatever this transformers version calls the switch."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    else:
        model.config._attn_implementation = "eager"
    impl = getattr(model.config, "_attn_implementation", "eager")
    assert impl == "eager", f"could not select eager attention (got {impl})"


def randomize(model, gen):
    """std 0.1 matrices; norm gains ~1 ± 0.1; biases ~0 ± 0.1. Tied tensors are drawn once."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + noise)  # RMSNorm / LayerNorm gains
            else:
                p.copy_(noise)


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf_golden")
    only = set(sys.argv[2:])
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, V, (B, T), generator=gen)
    ids[0, -1] = V - 1  # the last real vocabulary row, next to Forge's padding
    ids[1, 0] = 0
    for name, (cls, cfg) in configs().items():
        model = cls(cfg).float().eval()  # eval: no dropout
        use_eager(model)
        randomize(model, gen)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        logits = out.logits.detach().float()
        assert logits.shape == (B, T, V), logits.shape
        grad_norms = {}
        for pname, p in model.named_parameters():  # tied parameters are listed once
            assert p.grad is not None, f"{name}: no gradient for {pname}"
            grad_norms[pname] = float(p.grad.double().norm())
        # The loss as Forge defines it: mean cross-entropy of position t predicting ids[t + 1].
        manual = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, V).double(), ids[:, 1:].reshape(-1))
        assert math.isclose(float(manual), float(out.loss), rel_tol=1e-5), (manual, out.loss)

        if only and name not in only:
            continue
        d = os.path.join(out_root, name)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        model.save_pretrained(d)  # safetensors, float32
        assert os.path.exists(os.path.join(d, "model.safetensors")), os.listdir(d)
        golden = {
            "name": name,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "batch": B, "seq_len": T, "vocab_size": V,
            "ids": ids.tolist(),
            "logits": [[[float(x) for x in row] for row in seq] for seq in logits],
            "loss": float(out.loss),
            "grad_norms": grad_norms,
        }
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(golden, f)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        print(f"{name}: loss {float(out.loss):.6f}, {len(grad_norms)} parameters, "
              f"{size / 1e3:.0f} kB -> {d}")


if __name__ == "__main__":
    main()
