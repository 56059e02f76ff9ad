// Validators for command-line flags: the one place where every moeplan program
// (moeplan, moeplan-exec, moeplan-profile, moeplan-server) says what a numeric,
// path or name flag may hold. Header-only CLI11 validators; each program that
// includes this links CLI11 itself (moeplan::base does not).
//
//   cmd->add_option("--skew", a.skew, "...")->check(flags::FiniteInRange(0.0, 16.0));
//   cmd->add_option("--ranks", a.ranks, "...")->check(flags::IntAtLeast(1));
//   cmd->add_option("--trace", a.trace, "...")->check(flags::NonEmpty());
//
// Why not CLI::Range: every comparison with NaN is false, so Range(0, 16)
// passes "nan", and a flag whose code then tests `x > 0` falls back to a
// default without a word. These parse the value as CLI11 will convert it
// (CLI::detail::lexical_cast) and refuse anything not finite, not a whole
// number where one is needed, or out of range. CLI11 puts the option's name in
// front of the message, so a refusal reads, on one line:
//   --gpu-memory-gib: must be a finite number in [0, 1000000] (got nan)
// A flag's default is not validated (CLI11 checks given values only): a
// default such as 0 meaning "the profile's" stays expressible as the absence of
// the flag, while an explicit value has to be a real one.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace moeplan::flags {

namespace flags_internal {

inline std::string Got(const std::string& value) { return fmt::format(" (got {})", value); }

// `lo` to `hi` as a rule: "in [lo, hi]", ">= lo" or "> lo" (hi infinite).
inline std::string RangeRule(double lo, double hi, bool lo_open) {
  if (std::isinf(hi)) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  return fmt::format("in {}{}, {}]", lo_open ? "(" : "[", lo, hi);
}

inline CLI::Validator Real(double lo, double hi, bool lo_open) {
  const std::string rule = "a finite number " + RangeRule(lo, hi, lo_open);
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        double x = 0.0;
        if (!CLI::detail::lexical_cast(value, x) || !std::isfinite(x) || x < lo || x > hi ||
            (lo_open && x == lo)) {
          return "must be " + rule + Got(value);
        }
        return std::string();
      },
      rule);
}

}  // namespace flags_internal

// A finite number x with lo <= x <= hi (NaN and infinities refused).
inline CLI::Validator FiniteInRange(double lo, double hi) {
  return flags_internal::Real(lo, hi, false);
}

// A finite number x >= lo.
inline CLI::Validator FiniteAtLeast(double lo) {
  return flags_internal::Real(lo, std::numeric_limits<double>::infinity(), false);
}

// A finite number x with lo < x <= hi (e.g. FiniteAbove(0): a positive amount).
inline CLI::Validator FiniteAbove(double lo, double hi = std::numeric_limits<double>::infinity()) {
  return flags_internal::Real(lo, hi, true);
}

namespace flags_internal {

// `rule` for the help text and most refusals; a value over `hi` that `rule`
// does not show (an int's limit) is told both bounds.
inline CLI::Validator Int(int64_t lo, int64_t hi, const std::string& rule) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        int64_t n = 0;
        if (!CLI::detail::lexical_cast(value, n) || n < lo) return "must be " + rule + Got(value);
        if (n > hi) return fmt::format("must be an integer in [{}, {}]{}", lo, hi, Got(value));
        return std::string();
      },
      rule);
}

}  // namespace flags_internal

// A whole number lo <= n <= hi, written as CLI11 reads integers (decimal, or
// 0x / 0 prefixed). A negative value for an unsigned flag, which CLI11 would
// wrap around, is refused by a lo of 0.
inline CLI::Validator IntInRange(int64_t lo, int64_t hi) {
  return flags_internal::Int(lo, hi, fmt::format("an integer in [{}, {}]", lo, hi));
}

// A whole number n >= lo that fits an int (the type of most count flags).
inline CLI::Validator IntAtLeast(int64_t lo) {
  return flags_internal::Int(lo, std::numeric_limits<int>::max(),
                             fmt::format("an integer >= {}", lo));
}

// A count of at least one (ranks, iterations, threads when given).
inline CLI::Validator PositiveInt() { return IntAtLeast(1); }

// A path, address or name that must say something: an empty value would
// otherwise mean "none" or "the default" and be silently ignored.
inline CLI::Validator NonEmpty() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        return value.empty() ? "must not be empty (got '')" : std::string();
      },
      "non-empty");
}

// --mpi-wait of moeplan-exec and moeplan-profile, one definition: a profile
// and the runs predicted with it must wait for their collectives alike.
inline CLI::Option* AddMpiWait(CLI::App& app, std::string* value) {
  return app
      .add_option("--mpi-wait", *value,
                  "mpi backend: how a rank's threads wait for a collective: spin (MPI_Waitall, "
                  "holding the core) or sleep (test, then sleep between tests, leaving the core "
                  "to the rank's compute thread and to other ranks); profile and runs must wait "
                  "alike (docs/executor.md \"Waiting\")")
      ->check(CLI::IsMember({"spin", "sleep"}))
      ->capture_default_str();
}

}  // namespace moeplan::flags
