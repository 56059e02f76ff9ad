// Status propagation, the one style every moeplan library uses: an error
// returns from the enclosing function unchanged, an OK result continues.
// (Errors themselves are absl::Status / absl::StatusOr; see docs/conventions.md.)
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MOEPLAN_CONCAT_INNER(a, b) a##b
#define MOEPLAN_CONCAT(a, b) MOEPLAN_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function unless it is OK.
#define MOEPLAN_RETURN_IF_ERROR(expr)           \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (0)

// `lhs` = the value of the StatusOr `expr`, or returns its status. `lhs` may
// declare a variable (`MOEPLAN_ASSIGN_OR_RETURN(auto x, F())`); it expands to
// several statements, so it cannot be the body of an unbraced if.
#define MOEPLAN_ASSIGN_OR_RETURN(lhs, expr) \
  MOEPLAN_ASSIGN_OR_RETURN_IMPL(MOEPLAN_CONCAT(_statusor_, __LINE__), lhs, expr)
#define MOEPLAN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(*tmp)
