// The one translation every binding file uses, defined in bindings.cc: a DLPack object to a core view
// (UsageError prefixed with `what` if the core cannot address it), and a call's byte counts to the
// {"bytes_sent", "bytes_received", "calls"} dict.
#pragma once
#include <nanobind/nanobind.h>

#include <string>

#include "hvdc/comm_stats.h"
#include "hvdc/tensor.h"

namespace hvdc {

TensorView binding_view_of(nanobind::handle obj, const std::string& what);
nanobind::dict binding_stats(const CommStats& s);

}  // namespace hvdc
