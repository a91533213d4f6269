// Every CPU op, forward and backward, float and double, gives bit-identical outputs with 1, 2, 3
// and 4 OpenMP threads (the README's determinism promise, op by op). Shapes are awkward on
// purpose — no size is a multiple of a block or of a thread count — and large enough that every
// op really forks: matmul and linear cut a product in chunks of ~1 MFLOP and at least 64 rows
// or columns, so their shapes are chosen at 2–10 MFLOP with sides up to 397. Outputs are compared
// with memcmp; a mismatch names the buffer, the thread count and the first differing element with
// both values.
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "forge/ops/activation.h"
#include "forge/ops/adamw.h"
#include "forge/ops/attention.h"
#include "forge/ops/cross_entropy.h"
#include "forge/ops/embedding.h"
#include "forge/ops/grad_norm.h"
#include "forge/ops/layernorm.h"
#include "forge/ops/linear.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/rmsnorm.h"
#include "forge/ops/rope.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::random_ids;
using forge::testing::random_normal;

// One output buffer of an op, kept as raw bytes so the comparison is exactly memcmp.
struct Output {
  std::string name;
  size_t elem_size;  // 4: float, 8: double
  std::vector<unsigned char> bytes;
};

template <typename T>
Output output(std::string name, const std::vector<T>& v) {
  Output o{std::move(name), sizeof(T), std::vector<unsigned char>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
  return o;
}

double value_at(const Output& o, size_t i) {
  if (o.elem_size == sizeof(float)) {
    float f;
    std::memcpy(&f, o.bytes.data() + i * sizeof f, sizeof f);
    return f;
  }
  double d;
  std::memcpy(&d, o.bytes.data() + i * sizeof d, sizeof d);
  return d;
}

// First differing element of two same-named buffers, or "" when they are identical.
std::string first_mismatch(const Output& want, const Output& got) {
  if (want.bytes.size() != got.bytes.size())
    return "size " + std::to_string(got.bytes.size()) + " vs " + std::to_string(want.bytes.size());
  // An empty buffer's data() may be null, which memcmp must not be given even for 0 bytes.
  if (want.bytes.empty() ||
      std::memcmp(want.bytes.data(), got.bytes.data(), want.bytes.size()) == 0)
    return "";
  const size_t n = want.bytes.size() / want.elem_size;
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(want.bytes.data() + i * want.elem_size, got.bytes.data() + i * got.elem_size,
                    want.elem_size) != 0) {
      if (first == n) first = i;
      ++bad;
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "%zu of %zu elements differ; first [%zu]: %.17g vs %.17g (1 thread)", bad, n, first,
                value_at(got, first), value_at(want, first));
  return buf;
}

// Restores the OpenMP thread count when a test ends, even through a failed assertion.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(omp_get_max_threads()) {}
  ~ThreadCountGuard() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// Runs op() with 1 thread, then with 2, 3 and 4, and expects every output bit-identical.
// op must build its outputs from scratch (fresh copies of the inputs) on each call.
void expect_thread_count_independent(const std::string& what,
                                     const std::function<std::vector<Output>()>& op) {
  ThreadCountGuard guard;
  omp_set_num_threads(1);
  const std::vector<Output> want = op();
  for (int threads : {2, 3, 4}) {
    omp_set_num_threads(threads);
    const std::vector<Output> got = op();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string diff = first_mismatch(want[i], got[i]);
      EXPECT_TRUE(diff.empty()) << what << ": " << want[i].name << " with " << threads
                                << " threads: " << diff;
    }
  }
}

template <typename T>
class ThreadCount : public ::testing::Test {};
using Dtypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ThreadCount, Dtypes);

TYPED_TEST(ThreadCount, Matmul) {
  using T = TypeParam;
  // (M, N, K): cut in 2 and 4 chunks of rows, in 2 and 4 chunks of columns (each with a short
  // last chunk), and in 2 chunks of columns with M = 3 (which the old split by thread count cut
  // into rows of 2 and 1).
  const int shapes[][3] = {
      {237, 70, 149}, {397, 45, 120}, {53, 131, 151}, {45, 397, 120}, {3, 509, 700}};
  uint64_t seed = 1000;
  for (const auto& mnk : shapes) {
    const int M = mnk[0], N = mnk[1], K = mnk[2];
    const auto a = random_normal<T>(static_cast<size_t>(M) * K, seed++);
    const auto b = random_normal<T>(static_cast<size_t>(K) * N, seed++);
    const auto c0 = random_normal<T>(static_cast<size_t>(M) * N, seed++);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const std::string what = "matmul M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                 " K=" + std::to_string(K) + " ta=" + std::to_string(ta) +
                                 " tb=" + std::to_string(tb);
        expect_thread_count_independent(what, [&] {
          std::vector<T> c(M * N), c_acc = c0;
          matmul<T>(c.data(), a.data(), b.data(), M, N, K, ta, tb);
          matmul<T>(c_acc.data(), a.data(), b.data(), M, N, K, ta, tb, T(0.5), T(1));
          return std::vector<Output>{output("c", c), output("c (alpha 0.5, beta 1)", c_acc)};
        });
      }
    }
  }
}

TYPED_TEST(ThreadCount, MatmulBatched) {
  using T = TypeParam;
  const int M = 131, N = 45, K = 171, batch = 3;
  const auto a = random_normal<T>(batch * M * K, 1100);
  const auto b = random_normal<T>(batch * K * N, 1101);
  expect_thread_count_independent("matmul_batched", [&] {
    std::vector<T> c(batch * M * N);
    matmul_batched<T>(c.data(), a.data(), b.data(), M, N, K, false, true, batch, M * K, K * N,
                      M * N);
    return std::vector<Output>{output("c", c)};
  });
}

TYPED_TEST(ThreadCount, Linear) {
  using T = TypeParam;
  // (N, C, OC): 10 MFLOP per product, every one of the three cut in several chunks (of rows
  // or columns), OC past two 64-channel bias blocks; then the shape of the vocabulary head.
  const int shapes[][3] = {{261, 130, 150}, {37, 50, 1031}};
  uint64_t seed = 1200;
  for (const auto& s : shapes) {
    const int N = s[0], C = s[1], OC = s[2];
    const auto inp = random_normal<T>(N * C, seed++);
    const auto weight = random_normal<T>(C * OC, seed++);
    const auto bias = random_normal<T>(OC, seed++);
    const auto dout = random_normal<T>(N * OC, seed++);
    const auto dinp0 = random_normal<T>(N * C, seed++);
    const auto dweight0 = random_normal<T>(C * OC, seed++);
    const auto dbias0 = random_normal<T>(OC, seed++);
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      const std::string what = "linear N=" + std::to_string(N) + " C=" + std::to_string(C) +
                               " OC=" + std::to_string(OC) +
                               (layout == WeightLayout::kOutIn ? " (out, in)" : " (in, out)");
      expect_thread_count_independent(what, [&] {
        std::vector<T> out(N * OC), dinp = dinp0, dweight = dweight0, dbias = dbias0;
        linear_fwd<T>(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC, layout);
        linear_bwd<T>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                      weight.data(), N, C, OC, layout);
        return std::vector<Output>{output("out", out), output("dinp", dinp),
                                   output("dweight", dweight), output("dbias", dbias)};
      });
    }
  }
}

TYPED_TEST(ThreadCount, BiasGrad) {
  using T = TypeParam;
  const int N = 301, OC = 197;
  const auto dout = random_normal<T>(N * OC, 1300);
  expect_thread_count_independent("bias_grad", [&] {
    std::vector<T> dbias(OC, T(0.25));
    bias_grad<T>(dbias.data(), dout.data(), N, OC);
    return std::vector<Output>{output("dbias", dbias)};
  });
}

TYPED_TEST(ThreadCount, LayerNorm) {
  using T = TypeParam;
  const int N = 67, C = 130;
  const auto inp = random_normal<T>(N * C, 1400);
  const auto other = random_normal<T>(N * C, 1401);
  const auto weight = random_normal<T>(C, 1402);
  const auto bias = random_normal<T>(C, 1403);
  const auto dout = random_normal<T>(N * C, 1404);
  expect_thread_count_independent("layernorm", [&] {
    std::vector<T> out(N * C), mean(N), rstd(N), res(N * C), out2(N * C), mean2(N), rstd2(N);
    layernorm_fwd<T>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                     N, C, 1e-5f);
    residual_layernorm_fwd<T>(res.data(), out2.data(), mean2.data(), rstd2.data(), inp.data(),
                              other.data(), weight.data(), bias.data(), N, C, 1e-5f);
    std::vector<T> dinp(N * C, T(0)), dweight(C, T(0)), dbias(C, T(0));
    layernorm_bwd<T>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                     weight.data(), mean.data(), rstd.data(), N, C);
    return std::vector<Output>{output("out", out),           output("mean", mean),
                               output("rstd", rstd),         output("residual", res),
                               output("residual out", out2), output("dinp", dinp),
                               output("dweight", dweight),   output("dbias", dbias)};
  });
}

TYPED_TEST(ThreadCount, RmsNorm) {
  using T = TypeParam;
  const int N = 67, C = 130;
  const auto inp = random_normal<T>(N * C, 1500);
  const auto other = random_normal<T>(N * C, 1501);
  const auto weight = random_normal<T>(C, 1502);
  const auto dout = random_normal<T>(N * C, 1503);
  expect_thread_count_independent("rmsnorm", [&] {
    std::vector<T> out(N * C), rstd(N), res(N * C), out2(N * C), rstd2(N);
    rmsnorm_fwd<T>(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-5f);
    residual_rmsnorm_fwd<T>(res.data(), out2.data(), rstd2.data(), inp.data(), other.data(),
                            weight.data(), N, C, 1e-5f);
    std::vector<T> dinp(N * C, T(0)), dweight(C, T(0));
    rmsnorm_bwd<T>(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(),
                   N, C);
    return std::vector<Output>{output("out", out),      output("rstd", rstd),
                               output("residual", res), output("residual out", out2),
                               output("dinp", dinp),    output("dweight", dweight)};
  });
}

TYPED_TEST(ThreadCount, Embedding) {
  using T = TypeParam;
  const int B = 3, T_ = 37, C = 50, V = 23;  // V < B·T: ids repeat, dwte rows collect many
  const auto tokens = random_ids(B * T_, V, 1600);
  const auto wte = random_normal<T>(V * C, 1601);
  const auto wpe = random_normal<T>(T_ * C, 1602);
  const auto dout = random_normal<T>(B * T_ * C, 1603);
  expect_thread_count_independent("embedding", [&] {
    std::vector<T> out(B * T_ * C), out_nopos(B * T_ * C);
    embedding_fwd<T>(out.data(), tokens.data(), wte.data(), wpe.data(), B, T_, C);
    embedding_fwd<T>(out_nopos.data(), tokens.data(), wte.data(), nullptr, B, T_, C);
    std::vector<T> dwte(V * C, T(0)), dwpe(T_ * C, T(0));
    embedding_bwd<T>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T_, C);
    return std::vector<Output>{output("out", out), output("out (no wpe)", out_nopos),
                               output("dwte", dwte), output("dwpe", dwpe)};
  });
}

TYPED_TEST(ThreadCount, CrossEntropy) {
  using T = TypeParam;
  const int N = 37, V = 50, Vp = 56;
  const auto logits = random_normal<T>(N * Vp, 1700, 3.0);
  auto targets = random_ids(N, V, 1701);
  targets[5] = targets[20] = -1;  // ignore_index
  expect_thread_count_independent("cross_entropy", [&] {
    std::vector<T> losses(N), dlogits(N * Vp), in_place = logits;
    cross_entropy_fwd<T>(losses.data(), logits.data(), targets.data(), N, V, Vp);
    cross_entropy_bwd<T>(dlogits.data(), logits.data(), targets.data(), T(1) / N, N, V, Vp);
    cross_entropy_bwd<T>(in_place.data(), in_place.data(), targets.data(), T(1) / N, N, V, Vp);
    return std::vector<Output>{output("losses", losses), output("dlogits", dlogits),
                               output("dlogits (in place)", in_place)};
  });
}

TYPED_TEST(ThreadCount, Attention) {
  using T = TypeParam;
  // GQA (4 query heads on 2 kv heads), head size 10; causal, causal with a window, and full.
  const AttentionShape shapes[] = {
      {2, 37, 4, 2, 10, true, 0}, {2, 37, 4, 2, 10, true, 7}, {1, 23, 3, 3, 6, false, 0}};
  uint64_t seed = 1800;
  for (const AttentionShape& s : shapes) {
    const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.HS;
    const size_t nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.HS;
    const size_t natt = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    const auto q = random_normal<T>(nq, seed++), k = random_normal<T>(nkv, seed++);
    const auto v = random_normal<T>(nkv, seed++), dout = random_normal<T>(nq, seed++);
    const std::string what = "attention T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                             " NKV=" + std::to_string(s.NKV) +
                             " causal=" + std::to_string(s.causal) +
                             " window=" + std::to_string(s.window);
    expect_thread_count_independent(what, [&] {
      std::vector<T> out(nq), att(natt), dq(nq, T(0)), dk(nkv, T(0)), dv(nkv, T(0));
      attention_fwd<T>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
      attention_bwd<T>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       att.data(), s);
      return std::vector<Output>{output("out", out), output("att", att), output("dq", dq),
                                 output("dk", dk), output("dv", dv)};
    });
  }
}

TYPED_TEST(ThreadCount, FlashAttention) {
  using T = TypeParam;
  // GPT-2's layout (q, k, v column slices of one (B·T, 3C) buffer, gradients into another) and
  // the dense one with GQA and a window; each with the probabilities recomputed and saved.
  struct Case {
    AttentionShape s;
    bool fused_qkv;
  };
  const Case cases[] = {{{2, 37, 4, 4, 10, true, 0}, true}, {{2, 37, 4, 2, 10, true, 7}, false}};
  uint64_t seed = 2400;
  for (const Case& cs : cases) {
    const AttentionShape& s = cs.s;
    const int rows = s.B * s.T, cq = s.NH * s.HS, ckv = s.NKV * s.HS;
    // Dense: q (rows, cq), k and v (rows, ckv). Fused: one (rows, 3·cq) buffer.
    const int64_t sq = cs.fused_qkv ? 3 * cq : cq, skv = cs.fused_qkv ? 3 * cq : ckv;
    const AttentionStrides st =
        cs.fused_qkv ? AttentionStrides{sq, skv, skv, 0} : AttentionStrides{};
    const size_t nqkv = cs.fused_qkv ? static_cast<size_t>(rows) * 3 * cq
                                     : static_cast<size_t>(rows) * (cq + 2 * ckv);
    const auto qkv = random_normal<T>(nqkv, seed++);
    const auto dout = random_normal<T>(static_cast<size_t>(rows) * cq, seed++);
    const T* q = qkv.data();
    const T* k = cs.fused_qkv ? q + cq : q + static_cast<size_t>(rows) * cq;
    const T* v = cs.fused_qkv ? q + 2 * cq : k + static_cast<size_t>(rows) * ckv;
    const size_t nlse = static_cast<size_t>(s.B) * s.NH * s.T;
    for (bool save_probs : {false, true}) {
      const std::string what = std::string("flash_attention ") +
                               (cs.fused_qkv ? "fused qkv" : "GQA window 7") +
                               (save_probs ? ", probabilities saved" : "");
      expect_thread_count_independent(what, [&] {
        std::vector<T> out(static_cast<size_t>(rows) * cq), lse(nlse), dqkv(nqkv, T(0));
        std::vector<T> probs(save_probs ? nlse * s.T : 0, T(0));
        T* p = save_probs ? probs.data() : nullptr;
        flash_attention_fwd<T>(out.data(), lse.data(), q, k, v, s, st, p);
        T* dq = dqkv.data();
        T* dk = dq + (k - q);
        T* dv = dq + (v - q);
        flash_attention_bwd<T>(dq, dk, dv, dout.data(), q, k, v, out.data(), lse.data(), s, st, p);
        return std::vector<Output>{output("out", out), output("lse", lse), output("probs", probs),
                                   output("dq, dk, dv", dqkv)};
      });
    }
  }
}

TYPED_TEST(ThreadCount, LmHeadCrossEntropy) {
  using T = TypeParam;
  // N·Vp above the op's 2^22-logit chunk, so the rows are processed in two chunks (3,855 and
  // 145 rows at Vp = 1,088); a padded vocabulary and ignored targets.
  const int N = 4000, C = 20, V = 1031, Vp = 1088;
  const auto x = random_normal<T>(static_cast<size_t>(N) * C, 2500);
  const auto w = random_normal<T>(static_cast<size_t>(Vp) * C, 2501, 0.5);
  auto targets = random_ids(N, V, 2502);
  targets[7] = targets[3900] = -1;
  const auto dx0 = random_normal<T>(static_cast<size_t>(N) * C, 2503);
  const auto dw0 = random_normal<T>(static_cast<size_t>(Vp) * C, 2504);
  expect_thread_count_independent("lm_head_cross_entropy", [&] {
    std::vector<T> losses(N), losses_fwd(N), dx = dx0, dw = dw0;
    lm_head_cross_entropy<T>(losses.data(), dx.data(), dw.data(), x.data(), w.data(),
                             targets.data(), T(1) / N, N, C, V, Vp);
    lm_head_cross_entropy<T>(losses_fwd.data(), nullptr, nullptr, x.data(), w.data(),
                             targets.data(), T(0), N, C, V, Vp);
    return std::vector<Output>{output("losses", losses), output("dx", dx), output("dw", dw),
                               output("losses (forward only)", losses_fwd)};
  });
}

TYPED_TEST(ThreadCount, Rope) {
  using T = TypeParam;
  const int B = 2, T_ = 37, H = 3, HS = 10;
  const auto x = random_normal<T>(B * T_ * H * HS, 1900);
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
    expect_thread_count_independent("rope", [&] {
      std::vector<T> fwd = x, bwd = x;
      rope_fwd<T>(fwd.data(), B, T_, H, HS, Rope{10000.f, style}, 5);
      rope_bwd<T>(bwd.data(), B, T_, H, HS, Rope{10000.f, style}, 5);
      return std::vector<Output>{output("rope_fwd", fwd), output("rope_bwd", bwd)};
    });
  }
}

TYPED_TEST(ThreadCount, Activations) {
  using T = TypeParam;
  const int64_t n = 10007;
  const auto x = random_normal<T>(n, 2000, 3.0), y = random_normal<T>(n, 2001);
  const auto dout = random_normal<T>(n, 2002);
  const auto acc0 = random_normal<T>(n, 2003), acc1 = random_normal<T>(n, 2004);
  expect_thread_count_independent("activations", [&] {
    std::vector<T> gelu(n), dgelu = acc0, swiglu(n), dgate = acc0, dup = acc1, res(n), da = acc0,
                            db = acc1;
    gelu_fwd<T>(gelu.data(), x.data(), n);
    gelu_bwd<T>(dgelu.data(), x.data(), dout.data(), n);
    swiglu_fwd<T>(swiglu.data(), x.data(), y.data(), n);
    swiglu_bwd<T>(dgate.data(), dup.data(), dout.data(), x.data(), y.data(), n);
    residual_fwd<T>(res.data(), x.data(), y.data(), n);
    residual_bwd<T>(da.data(), db.data(), dout.data(), n);
    return std::vector<Output>{output("gelu", gelu),     output("dgelu", dgelu),
                               output("swiglu", swiglu), output("dgate", dgate),
                               output("dup", dup),       output("residual", res),
                               output("da", da),         output("db", db)};
  });
}

TYPED_TEST(ThreadCount, AdamW) {
  using T = TypeParam;
  const int64_t n = 10007;
  const auto param0 = random_normal<T>(n, 2100), m0 = random_normal<T>(n, 2101, 0.1);
  const auto grad = random_normal<T>(n, 2103);
  auto v0 = random_normal<T>(n, 2102, 0.1);
  for (auto& x : v0) x *= x;  // second moments are non-negative
  AdamWParams p;
  p.step = 7;
  p.grad_scale = 0.5f;
  expect_thread_count_independent("adamw_update", [&] {
    std::vector<T> param = param0, m = m0, v = v0;
    adamw_update<T>(param.data(), m.data(), v.data(), grad.data(), n, p);
    return std::vector<Output>{output("param", param), output("m", m), output("v", v)};
  });
}

TYPED_TEST(ThreadCount, GlobalNorm) {
  using T = TypeParam;
  const int64_t n = 3 * 65536 + 37;  // several of global_norm's blocks and a partial one
  const auto g = random_normal<T>(n, 2200);
  expect_thread_count_independent("global_norm", [&] {
    return std::vector<Output>{output("norm", std::vector<double>{global_norm<T>(g.data(), n)})};
  });
}

TEST(ThreadCountF32, SumInOrder) {
  const int64_t n = 100003;
  const auto x = random_normal<float>(n, 2300);
  expect_thread_count_independent("sum_in_order", [&] {
    return std::vector<Output>{output("sum", std::vector<double>{sum_in_order(x.data(), n)})};
  });
}

}  // namespace
}  // namespace forge::cpu
