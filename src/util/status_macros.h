// Early-return helpers for absl::Status, which abseil 20220623 does not provide.

#ifndef KPACK_SRC_UTIL_STATUS_MACROS_H_
#define KPACK_SRC_UTIL_STATUS_MACROS_H_

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KPACK_RETURN_IF_ERROR(expr)                                    \
  do {                                                                 \
    ::absl::Status kpack_status_ = (expr);                             \
    if (ABSL_PREDICT_FALSE(!kpack_status_.ok())) return kpack_status_; \
  } while (0)

#define KPACK_STATUS_CONCAT_INNER_(a, b) a##b
#define KPACK_STATUS_CONCAT_(a, b) KPACK_STATUS_CONCAT_INNER_(a, b)

// KPACK_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define KPACK_ASSIGN_OR_RETURN(lhs, expr) \
  KPACK_ASSIGN_OR_RETURN_IMPL_(KPACK_STATUS_CONCAT_(kpack_statusor_, __LINE__), lhs, expr)

#define KPACK_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)           \
  auto statusor = (expr);                                           \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return statusor.status(); \
  lhs = std::move(statusor).value()

#endif  // KPACK_SRC_UTIL_STATUS_MACROS_H_
