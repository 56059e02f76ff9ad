// The MPI backend the executor's multi-rank tests share (executor_mpi_test:
// mpi_test.cc holds main, which makes it; every test file reads it).
#pragma once

#include "moeplan/executor/backends.h"

namespace moeplan::executor::mpi_test {

extern Backend* g_backend;
inline int WorldSize() { return g_backend->world->size(); }
inline int WorldRank() { return g_backend->world->rank(); }

}  // namespace moeplan::executor::mpi_test
