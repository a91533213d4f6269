// The joinable decode loop (generate/decode_loop.h) on a tiny random GPT-2: a request admitted
// while another is decoding, one cancelled, and one admitted into a slot that idled past the
// cache's capacity all get exactly the ids they get alone (generate_batch with one slot) —
// with the steps pipelined (a step's ids handed out while the next one is enqueued) and without.
#include <gtest/gtest.h>

#include <map>

#include "forge/generate/decode_loop.h"
#include "forge/generate/generator.h"
#include "forge/model/transformer.h"

namespace forge {
namespace {

class DecodeLoopTest : public ::testing::TestWithParam<bool> {
 protected:
  DecodeLoopTest() : model_(tiny()) { model_.init_weights(7); }
  static ModelConfig tiny() {
    ModelConfig cfg = preset_config("tiny");
    cfg.vocab_size = 97;
    cfg.max_seq_len = 64;
    cfg.n_layer = 2;
    cfg.n_embd = 32;
    cfg.n_head = cfg.n_kv_head = 2;
    cfg.ffn_hidden = 64;
    return cfg;
  }
  static GenRequest request(std::vector<int32_t> prompt, int max_new, float temperature = 0, uint64_t seed = 0) {
    GenRequest q;
    q.prompt = std::move(prompt);
    q.max_new_tokens = max_new;
    q.sampling.temperature = temperature;
    q.sampling.seed = seed;
    return q;
  }
  // The ids `q` gets on its own.
  GenResult alone(const GenRequest& q, int capacity = 0) {
    GenOptions o;
    o.max_batch = 1;
    o.capacity = capacity;
    return generate_batch(model_, {q}, o)[0];
  }
  using Loop = DecodeLoop<CpuBackend<float>>;
  std::unique_ptr<Loop> open(int slots, int capacity) {
    DecodeLoopOptions o;
    o.slots = slots;
    o.capacity = capacity;
    o.pipeline = GetParam();
    return std::make_unique<Loop>(
        model_, o, [this](int tag, int32_t) { return ++tokens_[tag] > 0; },
        [this](int tag, GenResult&& r) { done_[tag] = std::move(r); });
  }

  Transformer<float> model_;
  std::map<int, int> tokens_;
  std::map<int, GenResult> done_;
};

TEST_P(DecodeLoopTest, ARequestJoiningMidDecodeGetsItsIdsAlone) {
  const GenRequest a = request({1, 2, 3, 4}, 20), b = request({9, 8}, 12);
  const GenRequest c = request({5, 6, 7}, 10, 0.9f, 1234);  // sampled: keyed by seed and position only
  const GenResult want_a = alone(a), want_b = alone(b), want_c = alone(c);
  ASSERT_EQ(want_a.ids.size(), 20u);
  auto loop = open(3, 64);
  loop->admit(a, 0);
  for (int i = 0; i < 5; ++i) loop->step();
  EXPECT_EQ(loop->live(), 1);
  loop->admit(b, 1);
  loop->step();
  loop->admit(c, 2);
  EXPECT_FALSE(loop->has_free_slot());
  while (loop->live() > 0) loop->step();
  ASSERT_EQ(done_.size(), 3u);
  EXPECT_EQ(done_[0].ids, want_a.ids);
  EXPECT_EQ(done_[1].ids, want_b.ids);
  EXPECT_EQ(done_[2].ids, want_c.ids);
  EXPECT_EQ(done_[0].reason, FinishReason::kLength);
  EXPECT_EQ(tokens_[0], 20);  // on_token once per id
}

// A step decodes the rows up to the highest live slot (rounded up to a power of two), and a
// request's ids do not depend on how many rows ran beside it.
TEST_P(DecodeLoopTest, StepsOnlyTheRowsUpToTheHighestLiveSlot) {
  const GenRequest a = request({1, 2, 3, 4}, 30), b = request({9, 8}, 12), c = request({5, 6, 7}, 6);
  const GenResult want_a = alone(a), want_b = alone(b), want_c = alone(c);
  auto loop = open(8, 64);
  EXPECT_EQ(loop->rows(), 0);
  loop->admit(a, 0);  // slot 0
  loop->step();
  EXPECT_EQ(loop->rows(), 1);
  EXPECT_EQ(model_.decode_rows(), 1);
  loop->admit(b, 1);  // slot 1
  loop->step();
  EXPECT_EQ(loop->rows(), 2);
  loop->admit(c, 2);  // slot 2: rows 4
  loop->step();
  EXPECT_EQ(loop->rows(), 4);
  while (done_.count(2) == 0) loop->step();  // c ends first (6 ids)
  EXPECT_TRUE(loop->cancel(1));               // b's slot too: only slot 0 is left
  loop->step();
  EXPECT_EQ(loop->rows(), 1);
  while (loop->live() > 0) loop->step();
  EXPECT_EQ(done_[0].ids, want_a.ids);
  EXPECT_EQ(done_[2].ids, want_c.ids);
  const std::vector<int32_t> b_prefix(want_b.ids.begin(), want_b.ids.begin() + done_[1].ids.size());
  EXPECT_EQ(done_[1].ids, b_prefix);
  EXPECT_EQ(done_[1].reason, FinishReason::kCaller);
}

TEST_P(DecodeLoopTest, CancelFreesTheSlotForTheNextRequest) {
  const GenRequest a = request({1, 2, 3}, 30), b = request({4, 5}, 8);
  const GenResult want_a = alone(a), want_b = alone(b);
  auto loop = open(1, 64);
  loop->admit(a, 0);
  for (int i = 0; i < 3; ++i) loop->step();
  EXPECT_FALSE(loop->has_free_slot());
  EXPECT_TRUE(loop->cancel(0));
  EXPECT_FALSE(loop->cancel(0));  // no longer live
  EXPECT_EQ(loop->live(), 0);
  ASSERT_EQ(done_.count(0), 1u);
  EXPECT_EQ(done_[0].reason, FinishReason::kCaller);
  // The prefill's id and three steps' — pipelined, the third step's id was not handed out yet.
  ASSERT_EQ(done_[0].ids.size(), GetParam() ? 3u : 4u);
  EXPECT_TRUE(std::equal(done_[0].ids.begin(), done_[0].ids.end(), want_a.ids.begin()));
  loop->admit(b, 1);
  while (loop->live() > 0) loop->step();
  EXPECT_EQ(done_[1].ids, want_b.ids);
}

// Slot 1 idles through 2 × 14 steps of a 16-token cache (its position clamped at 15, its rows
// rewritten) before a request takes it.
TEST_P(DecodeLoopTest, ASlotIdlePastTheCapacityServesTheNextRequestRight) {
  const GenRequest a = request({1, 2}, 14), c = request({3, 4}, 14), b = request({7, 8, 9}, 20);
  auto loop = open(2, 16);
  EXPECT_EQ(loop->context(), 16);
  loop->admit(a, 0);
  while (loop->live() > 0) loop->step();
  loop->admit(c, 2);
  while (loop->live() > 0) loop->step();
  loop->admit(a, 3);  // into slot 0, the first free one
  loop->admit(b, 1);  // into slot 1
  while (loop->live() > 0) loop->step();
  const GenResult want_a = alone(a), want_b = alone(b, 16), want_c = alone(c);
  EXPECT_EQ(done_[0].ids, want_a.ids);
  EXPECT_EQ(done_[2].ids, want_c.ids);
  EXPECT_EQ(want_b.ids.size(), 13u);
  EXPECT_EQ(done_[1].ids, want_b.ids);
  EXPECT_EQ(done_[3].ids, want_a.ids);
  EXPECT_EQ(done_[1].reason, FinishReason::kContext);  // 3 + 13 = the 16-token context
}

TEST_P(DecodeLoopTest, BadRequestsAndAFullLoopAreErrors) {
  auto loop = open(1, 8);
  EXPECT_THROW(loop->admit(request({}, 4), 0), Error);
  EXPECT_THROW(loop->admit(request({97}, 4), 0), Error);
  EXPECT_THROW(loop->admit(request({1, 2, 3, 4, 5, 6, 7, 8, 9}, 1), 0), Error);  // longer than the context
  loop->admit(request({1}, 4), 0);
  EXPECT_THROW(loop->admit(request({1}, 4), 1), Error);  // no free slot
  loop->admit(request({1}, 0), 2);                         // ends at once: no slot needed
  EXPECT_EQ(done_[2].ids.size(), 0u);
}

// Pipelined, a step hands out the ids of the step before it; waiting, its own.
TEST_P(DecodeLoopTest, AStepHandsOutTheIdsOfTheStepBeforeWhenPipelined) {
  auto loop = open(1, 64);
  loop->admit(request({1, 2, 3}, 10), 0);
  EXPECT_EQ(tokens_[0], 1);  // the prefill's
  loop->step();
  EXPECT_EQ(tokens_[0], GetParam() ? 1 : 2);
  loop->step();
  EXPECT_EQ(tokens_[0], GetParam() ? 2 : 3);
  while (loop->live() > 0) loop->step();
  EXPECT_EQ(tokens_[0], 10);
}

// A request that ends was decoded one step more when pipelined; that id must go to nobody, not
// to the request admitted into its slot before the step's ids are handed out.
TEST_P(DecodeLoopTest, AnEndedRequestsLastStepIsNotHandedToItsSlotsNextRequest) {
  const GenRequest a = request({1, 2, 3, 4}, 30), b = request({9, 8}, 5), d = request({6, 5, 4}, 9, 0.8f, 99);
  const GenResult want_a = alone(a), want_b = alone(b), want_d = alone(d);
  auto loop = open(2, 64);
  loop->admit(a, 0);
  loop->admit(b, 1);
  while (done_.count(1) == 0) loop->step();
  EXPECT_EQ(loop->live(), 1);
  loop->admit(d, 2);  // into slot 1, at once
  while (loop->live() > 0) loop->step();
  EXPECT_EQ(done_[0].ids, want_a.ids);
  EXPECT_EQ(done_[1].ids, want_b.ids);
  EXPECT_EQ(done_[2].ids, want_d.ids);
  EXPECT_EQ(tokens_[2], 9);
}

// Requests admitted together are prefilled in packed rows (here 30 + 30 tokens in one, 20 in the
// next: the 64-token context caps a row) and still get the ids they get alone; one asking for
// no ids ends at once without a slot, an invalid one and one beyond the free slots are refused
// by name and the others admitted.
TEST_P(DecodeLoopTest, RequestsAdmittedTogetherGetTheirIdsAlone) {
  auto ids = [](int n, int32_t first) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = (first + 7 * i) % 97;
    return v;
  };
  const GenRequest a = request({1, 2, 3}, 25), b = request(ids(30, 5), 12), c = request(ids(30, 11), 9, 0.9f, 77);
  const GenRequest d = request(ids(20, 3), 14), zero = request({4, 4}, 0), bad = request({}, 5), e = request({8}, 5);
  const GenResult want_a = alone(a), want_b = alone(b), want_c = alone(c), want_d = alone(d);
  auto loop = open(4, 64);
  loop->admit(a, 0);
  loop->step();
  loop->step();
  const std::vector<std::string> why = loop->admit_batch({&b, &zero, &c, &bad, &d, &e}, {1, 2, 3, 4, 5, 6});
  ASSERT_EQ(why.size(), 6u);
  EXPECT_EQ(why[0], "");
  EXPECT_EQ(why[1], "");
  EXPECT_EQ(why[2], "");
  EXPECT_NE(why[3].find("empty"), std::string::npos) << why[3];
  EXPECT_EQ(why[4], "");
  EXPECT_NE(why[5].find("busy"), std::string::npos) << why[5];
  ASSERT_EQ(done_.count(2), 1u);  // no ids asked: ended at once
  EXPECT_TRUE(done_[2].ids.empty());
  EXPECT_EQ(loop->live(), 4);
  EXPECT_EQ(tokens_[1], 1);  // each admitted request has its first id
  EXPECT_EQ(tokens_[3], 1);
  EXPECT_EQ(tokens_[5], 1);
  while (loop->live() > 0) loop->step();
  EXPECT_EQ(done_[0].ids, want_a.ids);
  EXPECT_EQ(done_[1].ids, want_b.ids);
  EXPECT_EQ(done_[3].ids, want_c.ids);
  EXPECT_EQ(done_[5].ids, want_d.ids);
  EXPECT_EQ(done_.count(4), 0u);
  EXPECT_EQ(done_.count(6), 0u);
}

INSTANTIATE_TEST_SUITE_P(Steps, DecodeLoopTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Pipelined" : "Waiting"; });

}  // namespace
}  // namespace forge
