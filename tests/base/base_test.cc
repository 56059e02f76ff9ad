// moeplan::base: the shared helpers, checked against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moeplan/base/bf16.h"
#include "moeplan/base/format.h"
#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan {
namespace {

TEST(Stats, MedianOddEvenAndEmpty) {
  EXPECT_EQ(Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(Median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(Median({7.0}), 7.0);
  EXPECT_EQ(Median({}), 0.0);
  // Duplicates around the middle.
  EXPECT_EQ(Median({5.0, 1.0, 5.0, 9.0}), 5.0);
}

TEST(Stats, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4, 10], 90) = 4 + 0.6 * (10 - 4) = 7.6.
  EXPECT_DOUBLE_EQ(Percentile({10.0, 1.0, 3.0, 2.0, 4.0}, 90.0), 7.6);
  EXPECT_EQ(Percentile({10.0, 1.0, 3.0}, 0.0), 1.0);
  EXPECT_EQ(Percentile({10.0, 1.0, 3.0}, 100.0), 10.0);
  EXPECT_EQ(Percentile({10.0, 1.0, 3.0}, 50.0), 3.0);
  EXPECT_EQ(Percentile({10.0, 1.0, 3.0}, 250.0), 10.0);  // clamped
  EXPECT_EQ(Percentile({}, 90.0), 0.0);
}

TEST(Stats, Mean) {
  const std::vector<double> v = {1.0, 2.0, 6.0};
  EXPECT_EQ(Mean(v), 3.0);
  EXPECT_EQ(Mean({}), 0.0);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6: up to even.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above half-way rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(Bf16ToFloat(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(RoundToBf16(3.0f), 3.0f);
}

TEST(Bf16, InfinityAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  // The largest float rounds to infinity, as IEEE rounding does.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Bf16, NaNStaysQuietNaNWithSign) {
  // A signalling NaN whose payload sits only in the low 16 bits would round
  // to infinity without the NaN rule.
  const float snan = std::bit_cast<float>(uint32_t{0x7f800001});
  EXPECT_EQ(FloatToBf16(snan), 0x7fc0);
  const float neg_nan = std::bit_cast<float>(uint32_t{0xffc00000});
  EXPECT_EQ(FloatToBf16(neg_nan), 0xffc0);
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Format, Bytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(33.69 * 1024 * 1024), "33.69 MiB");
  EXPECT_EQ(FormatBytes(256.0 * (1 << 20)), "256 MiB");
  EXPECT_EQ(FormatBytes(1.25 * 1024 * 1024 * 1024 * 1024), "1.25 TiB");
}

TEST(Format, FlopsDurationPercent) {
  EXPECT_EQ(FormatFlops(512), "512 flop");
  EXPECT_EQ(FormatFlops(2.0 * 1024 * 1024), "2.097 Mflop");
  EXPECT_EQ(FormatDuration(0.85), "850 ns");
  EXPECT_EQ(FormatDuration(0), "0 us");
  EXPECT_EQ(FormatDuration(12.5), "12.5 us");
  EXPECT_EQ(FormatDuration(3200), "3.2 ms");
  EXPECT_EQ(FormatDuration(1.5e6), "1.5 s");
  EXPECT_EQ(FormatPercent(0.47), "47 %");
  EXPECT_EQ(FormatPercent(0.045), "4.5 %");
}

absl::Status FailIfNegative(int v) {
  if (v < 0) return absl::InvalidArgumentError(Cat("v: must be >= 0 (got ", v, ")"));
  return absl::OkStatus();
}
absl::StatusOr<int> Twice(int v) {
  MOEPLAN_RETURN_IF_ERROR(FailIfNegative(v));
  return 2 * v;
}
absl::StatusOr<int> TwicePlusOne(int v) {
  MOEPLAN_ASSIGN_OR_RETURN(const int t, Twice(v));
  return t + 1;
}

TEST(Status, MacrosPropagateErrorsAndValues) {
  EXPECT_EQ(*TwicePlusOne(3), 7);
  const absl::StatusOr<int> bad = TwicePlusOne(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(View(bad.status().message()), "v: must be >= 0 (got -1)");
}

TEST(Strings, ShellQuoteIsOneWord) {
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote(""), "''");
}

TEST(Strings, CatFormatsEveryArgument) {
  const std::string_view sv = "x";
  const absl::string_view av = "y";
  EXPECT_EQ(Cat(sv, av, 1, ' ', 0.5, "z"), "xy1 0.5z");
}

TEST(Strings, PrintableEscapesControlBytesAndCuts) {
  EXPECT_EQ(Printable("plain name-1.2"), "plain name-1.2");
  EXPECT_EQ(Printable("a\nb\x1b[31m\\"), "a\\x0ab\\x1b[31m\\x5c");
  EXPECT_EQ(Printable("\x7f"), "\\x7f");
  EXPECT_EQ(Printable("abcdef", 3), "abc...(6 bytes)");
  EXPECT_EQ(Printable(std::string_view("a\0b", 3)), "a\\x00b");
}

TEST(Strings, PrintableCutsAtACharacterBoundary) {
  EXPECT_EQ(Printable("ab\xc3\xa9", 3), "ab...(4 bytes)");  // "abé" keeps no half of the é
  EXPECT_EQ(Printable("ab\xc3\xa9", 4), "ab\xc3\xa9");
}

// The one way an error echoes a user's value (issue 35): bounded, escaped, quoted.
TEST(Strings, QuotedBoundsAndEscapesAValue) {
  EXPECT_EQ(Quoted("dpmoe"), "'dpmoe'");
  EXPECT_EQ(Quoted(""), "''");
  EXPECT_EQ(Quoted("a\x1b[31m\n"), "'a\\x1b[31m\\x0a'");
  EXPECT_EQ(Quoted(std::string(100 * 1024, 'x')),
            "'" + std::string(64, 'x') + "'... (102400 bytes)");
  EXPECT_EQ(Quoted(std::string(64, 'x')), "'" + std::string(64, 'x') + "'");
  EXPECT_EQ(Quoted(std::string(63, 'x') + "\xc3\xa9"),
            "'" + std::string(63, 'x') + "'... (65 bytes)");
  EXPECT_EQ(Quoted("abcdef", 2), "'ab'... (6 bytes)");
}

TEST(Strings, FindControlCharacterFindsC0DelAndC1) {
  EXPECT_EQ(FindControlCharacter("plain name, \xc3\xa9t\xc3\xa9 1.2"), std::string_view::npos);
  EXPECT_EQ(FindControlCharacter("a\x1b[31m"), 1u);
  EXPECT_EQ(FindControlCharacter(std::string_view("ab\0", 3)), 2u);
  EXPECT_EQ(FindControlCharacter("tab\there"), 3u);
  EXPECT_EQ(FindControlCharacter("del\x7f"), 3u);
  EXPECT_EQ(FindControlCharacter("csi\xc2\x9b[31m"), 3u);  // U+009B, the 8-bit CSI
  EXPECT_EQ(FindControlCharacter("nbsp\xc2\xa0"), std::string_view::npos);
}

}  // namespace
}  // namespace moeplan
