// A stall detector for distributed runs. The thread that drives a rank names
// each step it begins (an op, a barrier, a sample) with Watchdog::Step; a
// background thread ends the process when no step has begun for the timeout,
// after one line on stderr naming the program, the rank and the step it is
// stuck in: a peer that died or stalled leaves the others waiting inside a
// collective, and MPI cannot time such a wait out. Under mpirun a rank that
// exits without MPI_Finalize makes mpirun stop the whole job, so every rank
// of a stalled run is gone within about the timeout.
//
// Step costs an uncontended mutex (tens of nanoseconds): call it per op, not
// per element. One watchdog per process.
#pragma once

#include <chrono>
#include <string_view>

namespace moeplan {

class Watchdog {
 public:
  // Starts the watch (a timeout of 0 leaves it off). `program` and `rank`
  // prefix the message; the process exits with `exit_code`.
  static void Start(std::string_view program, int rank, std::chrono::milliseconds timeout,
                    int exit_code = 3);
  // The step this rank begins now; what the message names if it never ends.
  static void Step(std::string_view what);
  // Stops the watch (before MPI_Finalize, whose own waits are not watched).
  static void Stop();
};

}  // namespace moeplan
