// Exceptions the core throws; the bindings map each to a Python exception class of the same name.
#pragma once
#include <stdexcept>
#include <string>

namespace hvdc {

// Wrong use of the API on this rank (bad dtype, device, size): raised before any communication.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Some rank rejected its own input to a collective (bad dtype, device, layout); every rank throws
// it. A UsageError here; in Python both a UsageError (ValueError) and a RuntimeError, the class
// Horovod's users catch for a collective that failed.
struct RejectedInputError : UsageError {
  using UsageError::UsageError;
};

// Ranks called the same collective with different arguments; every rank throws it.
struct MismatchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A peer did not join a collective in time (dead, or stuck in different code).
struct CommTimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A peer left the job (its process is exiting: its script ended or called sys.exit) while this rank
// waited for it in a collective; the message names that rank and the collective. A CommTimeoutError,
// raised within seconds instead of at the timeout.
struct PeerExitedError : CommTimeoutError {
  using CommTimeoutError::CommTimeoutError;
};

// The MPI library reported an error.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace hvdc
