// agree_on_signature (cpp/src/signature.cc), the exchange every collective starts with, at
// n = 1..5 thread ranks: equal signatures pass; a signature that differs in any one field on one
// rank makes every rank throw MismatchError naming that field and the ranks' values; a rank that
// rejected its own input makes every rank throw UsageError naming it (also when its signature
// differs too, as Runtime::reject's does), with an over-long reason cut safely; a rank that never
// joins makes the others throw CommTimeoutError within the timeout, and one that joins late makes
// the others warn at the interval, naming the call and it; names that differ in their details name
// each detail that differs.
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "hvdc/errors.h"
#include "hvdc/signature.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;     // a rank that waits this long is deadlocked: fail, do not hang
constexpr double kTimeoutS = 30;  // the agreement's own timeout where nobody is missing
constexpr uint64_t kNameExchangeBytes = 2048;  // each rank's name where the names differ (signature.cc)

CallSignature base_signature() {
  TensorView t;
  t.numel = 4097;
  t.dtype = DType::kFloat32;
  return signature_of(kAllreduce, t, 0, "grad");
}

Outcome agree(Communicator& comm, const CallSignature& sig, double timeout_s) {
  return attempt([&] { agree_on_signature(comm, sig, timeout_s, "allreduce"); });
}

// Runs one agreement at n ranks, rank r contributing sig_of(r), and checks that every rank's
// outcome has `type` and contains each of `needles`.
void expect(Failures& f, const std::string& label, int n,
            const std::function<CallSignature(int)>& sig_of, const std::string& type,
            const std::vector<std::string>& needles, uint64_t extra_bytes = 0,
            const std::function<std::string(int)>& name_of = nullptr) {
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::vector<CommStats> stats(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    outcomes[r] = name_of ? attempt([&] { agree_on_signature(comm, sig_of(r), kTimeoutS, name_of(r)); })
                          : agree(comm, sig_of(r), kTimeoutS);
    stats[comm.rank()] = comm.stats();
  });
  f.ran();
  for (int r = 0; r < n; ++r) {
    const std::string what = str(label, ": rank ", r, " of ", n);
    if (!f.check(failed[r].empty(), what + " threw " + failed[r])) continue;
    f.check(outcomes[r].type == type, what + ": expected " + (type.empty() ? "no error" : type) +
                                          ", got " + outcomes[r].type + " '" +
                                          outcomes[r].message + "'");
    for (const std::string& needle : needles)
      f.check(outcomes[r].message.find(needle) != std::string::npos,
              what + ": message '" + outcomes[r].message + "' does not say '" + needle + "'");
    // One allgather of the signature, whatever the outcome; a second of the names where they differ.
    const uint64_t bytes = (sizeof(CallSignature) + extra_bytes) * static_cast<uint64_t>(n - 1);
    f.check(stats[r].bytes_sent == bytes && stats[r].bytes_received == bytes,
            str(what, ": counted ", stats[r].bytes_sent, "/", stats[r].bytes_received,
                " bytes, want ", bytes));
  }
}

void agreement(Failures& f, int n) {
  expect(f, "equal signatures", n, [](int) { return base_signature(); }, "", {});
}

// One field differs on rank `odd`; the message names that field and the differing rank's value.
void mismatch(Failures& f, int n) {
  struct Field {
    const char* name;     // as agree_on_signature's message names it
    const char* odd_value;
    void (*change)(CallSignature&);
  };
  const Field fields[] = {
      {"collective", "=3", [](CallSignature& s) { s.collective = kAdasum; }},
      {"op", "=1", [](CallSignature& s) { s.op = 1; }},
      {"dtype", "=float16", [](CallSignature& s) { s.dtype = static_cast<int32_t>(DType::kFloat16); }},
      {"device", "=1", [](CallSignature& s) { s.device = 1; }},
      {"numel", "=4096", [](CallSignature& s) { s.numel = 4096; }},
      {"tensor count", "=2", [](CallSignature& s) { s.ntensors = 2; }},
      {"tensor sizes (hash)", "=7", [](CallSignature& s) { s.layout_hash = 7; }},
      {"name (hash)", "=", [](CallSignature& s) { s.name_hash = fnv1a("other", 5); }},
  };
  for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); ++k) {
    const Field& field = fields[k];
    const int odd = static_cast<int>(k) % n;  // each rank is the odd one out in some case
    expect(
        f, str("mismatched ", field.name, " on rank ", odd), n,
        [&](int r) {
          CallSignature s = base_signature();
          if (r == odd) field.change(s);
          return s;
        },
        "MismatchError",
        {"ranks called it with different arguments", str(field.name, ":"),
         str("rank ", odd, field.odd_value)},
        // The names differ in their hash alone (the texts are equal): their exchange tells nothing more.
        field.change == fields[7].change ? kNameExchangeBytes : 0);
  }
}

// Ranks whose call names differ in their details (an algorithm's op and options after the '|'): every rank's
// message names each detail that differs with every rank's value, the shown names without their details, and
// nothing of the details that agree.
void detail_mismatch(Failures& f, int n) {
  const int odd = n - 1;
  const auto name_of = [&](int r) {
    return r == odd ? std::string("DistributedOptimizer.grad.0|op=Average\nlr=0.1")
                    : std::string("OneBitAdam.grad.0|op=OneBitAdam\nfreeze_step=") + (r == 0 ? "10" : "20") +
                          "\nlr=0.1";
  };
  std::string op = "op:", shown = "name:";
  for (int r = 0; r < n; ++r) {
    op += str(" rank ", r, "=", r == odd ? "Average" : "OneBitAdam", ";");
    shown += str(" rank ", r, "=", r == odd ? "DistributedOptimizer.grad.0" : "OneBitAdam.grad.0", ";");
  }
  // The odd rank's call has no freeze_step: named once, without values.
  const std::string freeze = "\n  details only some ranks' calls have: freeze_step";
  expect(
      f, "details differ", n,
      [&](int r) {
        CallSignature s = base_signature();
        s.name_hash = fnv1a(name_of(r).data(), name_of(r).size());
        return s;
      },
      "MismatchError", {op, freeze, shown, "\n  op:"}, kNameExchangeBytes, name_of);
  // lr agrees, the '|' and the details stay out of the call's name: checked on rank 0's message.
  std::string message;
  ThreadWorld world(n, kHangS);
  world.run([&](Communicator& comm) {
    CallSignature s = base_signature();
    s.name_hash = fnv1a(name_of(comm.rank()).data(), name_of(comm.rank()).size());
    const Outcome o = attempt([&] { agree_on_signature(comm, s, kTimeoutS, name_of(comm.rank())); });
    if (comm.rank() == 0) message = o.message;
  });
  f.check(message.find("lr:") == std::string::npos && message.find('|') == std::string::npos &&
              message.find("freeze_step:") == std::string::npos &&
              message.rfind("OneBitAdam.grad.0: ranks called it", 0) == 0,
          str("details differ at ", n, ": ", message));
}

// Ranks of one op whose option differs: that option, with every rank's value.
void option_mismatch(Failures& f, int n) {
  const auto name_of = [](int r) {
    return std::string("OneBitAdam.grad.0|op=OneBitAdam\nfreeze_step=") + (r == 0 ? "10" : "20") + "\nlr=0.1";
  };
  std::string freeze = "freeze_step:";
  for (int r = 0; r < n; ++r) freeze += str(" rank ", r, "=", r == 0 ? "10" : "20", ";");
  expect(
      f, "an option differs", n,
      [&](int r) {
        CallSignature s = base_signature();
        s.name_hash = fnv1a(name_of(r).data(), name_of(r).size());
        return s;
      },
      "MismatchError", {freeze}, kNameExchangeBytes, name_of);
}

// Rank `late` joins after `late_s`, longer than the warning interval and shorter than the timeout: every other
// rank is warned at the interval, naming the call and that rank (and no rank that joined), and the agreement
// then succeeds everywhere; the late rank itself is not warned.
void late_rank_warned(Failures& f, int n, int late) {
  constexpr double kEveryS = 0.1, kLateS = 0.45;
  std::mutex mu;
  std::vector<std::vector<std::string>> warnings(static_cast<size_t>(n));
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    if (r == late) std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
    JoinWait wait;
    wait.timeout_s = kTimeoutS;
    wait.warn_every_s = kEveryS;
    wait.warn = [&, r](const std::string& w) {
      const std::lock_guard<std::mutex> lock(mu);
      warnings[r].push_back(w);
    };
    outcomes[r] = attempt([&] { agree_on_signature(comm, base_signature(), wait, "Eval.loss|op=Average"); });
  });
  f.ran();
  for (int r = 0; r < n; ++r) {
    const std::string what = str("rank ", late, " late: rank ", r, " of ", n);
    if (!f.check(failed[r].empty() && outcomes[r].type.empty(), what + " failed: " + failed[r] + outcomes[r].message))
      continue;
    if (r == late) {
      f.check(warnings[r].empty(), what + ": the late rank was warned");
      continue;
    }
    // At 0.1, 0.2, 0.3 and 0.4 s; a loaded machine may let a few pass.
    if (!f.check(warnings[r].size() >= 2, str(what, ": ", warnings[r].size(), " warnings")) ) continue;
    const std::string& w = warnings[r][0];
    f.check(w.find(str("rank ", r, " has waited")) != std::string::npos &&
                w.find("in Eval.loss (allreduce of float32 [4097]) for " + str("rank ", late, " to join")) !=
                    std::string::npos &&
                w.find("HVDC_STALL_WARNING") != std::string::npos && w.find('|') == std::string::npos,
            what + ": warning '" + w + "'");
  }
}

// Rank `bad` rejected its input (with the bare signature Runtime::reject sends, which differs
// from the others' too): UsageError everywhere, naming the rank and its reason.
void rejection(Failures& f, int n, int bad, const std::string& why, const std::string& shown) {
  expect(
      f, str("rank ", bad, " rejects"), n,
      [&](int r) {
        if (r != bad) return base_signature();
        CallSignature s;
        s.collective = kAllreduce;
        std::snprintf(s.error, sizeof(s.error), "%s", why.c_str());
        return s;
      },
      "UsageError", {str("allreduce: rank ", bad, " rejected its input: "), shown});
}

// Rank `absent` never joins: every other rank throws CommTimeoutError after the timeout.
void timeout(Failures& f, int n, int absent) {
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::vector<double> waited(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    if (comm.rank() == absent) return;
    const auto start = std::chrono::steady_clock::now();
    outcomes[comm.rank()] = agree(comm, base_signature(), 0.2);
    waited[comm.rank()] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  f.ran();
  for (int r = 0; r < n; ++r) {
    const std::string what = str("rank ", absent, " absent: rank ", r, " of ", n);
    if (!f.check(failed[r].empty(), what + " threw " + failed[r]) || r == absent) continue;
    f.check(outcomes[r].type == "CommTimeoutError" &&
                outcomes[r].message.find(str("rank ", r, " waited")) != std::string::npos,
            what + ": expected CommTimeoutError, got " + outcomes[r].type + " '" +
                outcomes[r].message + "'");
    f.check(waited[r] >= 0.2 && waited[r] < 10, str(what, ": gave up after ", waited[r], " s"));
  }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (int n = 1; n <= 5; ++n) {
    hvdc::agreement(f, n);
    if (n > 1) hvdc::mismatch(f, n);
    if (n > 1) hvdc::detail_mismatch(f, n);
    if (n > 1) hvdc::option_mismatch(f, n);
    if (n > 1) hvdc::late_rank_warned(f, n, n == 2 ? 0 : 1);
    hvdc::rejection(f, n, n - 1, "tensor is not contiguous", "tensor is not contiguous");
    hvdc::rejection(f, n, 0, "bad dtype", "bad dtype");
    // A reason longer than the field arrives cut to its 159 characters, never unterminated.
    hvdc::rejection(f, n, n / 2, std::string(300, 'x'), std::string(159, 'x'));
    if (n > 1) {
      hvdc::timeout(f, n, n - 1);
      hvdc::timeout(f, n, 0);
    }
  }
  return f.finish("test_signature");
}
