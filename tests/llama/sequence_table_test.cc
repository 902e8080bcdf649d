// The KV cache's bookkeeping: which slots hold a sequence, their positions, and the
// refusals before a step could write past the capacity.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_cache.h"

namespace kpack::llama {
namespace {

using ::testing::HasSubstr;

TEST(LlamaSequenceTableTest, BeginAdvanceRelease) {
  SequenceTable t(/*slots=*/3, /*capacity=*/10);
  EXPECT_EQ(t.slots(), 3);
  EXPECT_EQ(t.capacity(), 10);
  for (int s = 0; s < 3; ++s) {
    EXPECT_FALSE(t.active(s));
    EXPECT_EQ(t.position(s), -1);
  }
  ASSERT_TRUE(t.Begin(0, 4).ok());
  ASSERT_TRUE(t.Begin(1, 7).ok());
  EXPECT_TRUE(t.active(0));
  EXPECT_EQ(t.position(0), 4);  // the first decoded token's position
  EXPECT_EQ(t.position(1), 7);
  EXPECT_TRUE(t.CheckDecode(2).ok());
  t.Advance(2);
  EXPECT_EQ(t.position(0), 5);
  EXPECT_EQ(t.position(1), 8);
  EXPECT_EQ(t.position(2), -1);  // outside the step: untouched
  t.Advance(1);
  EXPECT_EQ(t.position(0), 6);
  EXPECT_EQ(t.position(1), 8);
  // A slot starts over with a new prompt.
  ASSERT_TRUE(t.Begin(0, 2).ok());
  EXPECT_EQ(t.position(0), 2);
  t.Release(1);
  EXPECT_FALSE(t.active(1));
  t.Clear();
  EXPECT_FALSE(t.active(0));
}

TEST(LlamaSequenceTableTest, BeginRefusesBadSlotsAndPrompts) {
  SequenceTable t(2, 10);
  EXPECT_THAT(t.Begin(2, 4).message(),
              HasSubstr("sequence slot 2 does not exist (the KV cache has 2)"));
  EXPECT_THAT(t.Begin(-1, 4).message(), HasSubstr("sequence slot -1 does not exist"));
  EXPECT_THAT(t.Begin(0, 0).message(), HasSubstr("slot 0: a prompt of 0 tokens"));
  const absl::Status long_prompt = t.Begin(1, 11);
  EXPECT_EQ(long_prompt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_prompt.message(),
              HasSubstr("slot 1: a prompt of 11 tokens does not fit the KV cache capacity of 10"));
  EXPECT_FALSE(t.active(1));
  EXPECT_TRUE(t.Begin(1, 10).ok());  // fills the cache; no token may follow
  EXPECT_EQ(t.CheckDecode(2).code(), absl::StatusCode::kFailedPrecondition);  // slot 0 empty
}

TEST(LlamaSequenceTableTest, CheckDecodeNamesTheRow) {
  SequenceTable t(3, 6);
  EXPECT_THAT(t.CheckDecode(0).message(),
              HasSubstr("a decode step of 0 rows; the engine has 3 slots"));
  EXPECT_THAT(t.CheckDecode(4).message(), HasSubstr("a decode step of 4 rows"));
  ASSERT_TRUE(t.Begin(0, 4).ok());
  const absl::Status empty = t.CheckDecode(2);
  EXPECT_EQ(empty.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(empty.message(), HasSubstr("decode row 1: sequence slot 1 holds no sequence"));
  ASSERT_TRUE(t.Begin(1, 5).ok());
  ASSERT_TRUE(t.CheckDecode(2).ok());
  t.Advance(2);  // positions 5 and 6: slot 1 is full
  const absl::Status full = t.CheckDecode(2);
  EXPECT_EQ(full.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(full.message(),
              HasSubstr("decode row 1: sequence slot 1 is at position 6, and the KV "
                        "cache holds 6 positions per sequence"));
  // Row 0 alone still fits.
  EXPECT_TRUE(t.CheckDecode(1).ok());
}

}  // namespace
}  // namespace kpack::llama
