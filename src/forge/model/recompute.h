// Activation recomputation levels of training (Model::set_recompute, the `recompute` training
// setting): which per-layer activations the forward keeps for the backward and which the
// backward recomputes from what was kept. Results are bit-identical at every level (the
// recomputation runs the forward's own kernels on the same inputs); only memory and time change.
//   none: every layer keeps all its activations (the default).
//   attn: the attention's intermediates (q, k, v, qk_norm's q_raw/k_raw and statistics, the
//         attention's saved state, its output atty) are one shared set, recomputed from the
//         layer's ln1 before its attention backward.
//   mlp:  the MLP's intermediates (fc, up, hidden) are one shared set, recomputed from ln2.
//   full: a layer keeps only its input x_in (the residual stream); its backward first re-runs
//         the block's forward up to the MLP's hidden into the shared set.
#pragma once

#include <string>

#include "forge/core/error.h"

namespace forge {

enum class Recompute { kNone, kAttn, kMlp, kFull };

inline const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kAttn: return "attn";
    case Recompute::kMlp: return "mlp";
    case Recompute::kFull: return "full";
    default: return "none";
  }
}

// "none", "attn", "mlp" or "full"; anything else throws forge::Error naming them.
inline Recompute parse_recompute(const std::string& name) {
  for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kMlp, Recompute::kFull})
    if (name == recompute_name(r)) return r;
  throw Error(str("recompute: expected none, attn, mlp or full, got ", quote(name)));
}

}  // namespace forge
