// Status plumbing for the sources of the libraries built on the planner.
#pragma once

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

// `lhs` = the value of the StatusOr `expr`, or returns its status.
#define MOEPLAN_ASSIGN_OR_RETURN(lhs, expr) \
  MOEPLAN_ASSIGN_OR_RETURN_IMPL(MOEPLAN_CONCAT(_statusor_, __LINE__), lhs, expr)
#define MOEPLAN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(*tmp)
