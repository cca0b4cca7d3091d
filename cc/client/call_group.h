// CallGroup: waits for a set of asynchronous transport calls started together.
//
//   CallGroup group;
//   for (...) transport->GetParams(req, &resp, deadline, group.Add(address));
//   PS_RETURN_IF_ERROR(group.Wait());
//
// Wait returns the first failure in the order the calls were added, its message
// followed by " (server <label>)". Thread-safe: callbacks may run anywhere.
//
// A transport may ask the waiting thread to read its call's reply itself
// (AddHelper: the bulk channel does, saving the hand-off from a reader
// thread to the waiter); Wait runs those helpers before it blocks, when the
// group's only call still running is theirs, or when every helper says its
// reply is small (then it reads them one after another, in the order they
// were added: a table call split over servers); else it lets the transport
// read the replies, in parallel.
#ifndef PSERVER_CC_CLIENT_CALL_GROUP_H_
#define PSERVER_CC_CLIENT_CALL_GROUP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cc/client/transport.h"

namespace pserver {

class CallGroup {
 public:
  CallGroup() = default;
  CallGroup(const CallGroup&) = delete;
  CallGroup& operator=(const CallGroup&) = delete;
  // Waits for calls still running, so callbacks never outlive the group.
  ~CallGroup();

  // The completion callback Add returns (a transport finds its group with
  // Transport::Done::target<CallGroup::Completion>()).
  struct Completion {
    CallGroup* group;
    size_t slot;
    void operator()(absl::Status status) const;
  };

  // The completion callback for one more call to `label`.
  Transport::Done Add(std::string label);

  // Called on the thread that waits, before it blocks: with true when the
  // call it helps is the group's only one still running, or every helper
  // waiting to run is `small` (it must return once that call is done, which
  // it may complete itself, and others), else with false (it must return at
  // once, leaving the call to the transport).
  using Helper = std::function<void(bool read)>;
  // Added by a transport while starting a call of this group. `small`: the
  // call's reply is small enough to wait, unread, while the waiter reads
  // the group's other replies first (a reply the server can write whole
  // into the socket's buffer without waiting for it to be read).
  void AddHelper(Helper help, bool small = false);

  // Blocks until every added call has completed.
  absl::Status Wait();

  // Blocks until every added call has completed; each call's own status, in
  // the order they were added (messages not annotated).
  std::vector<absl::Status> WaitAll();

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> labels_ ABSL_GUARDED_BY(mu_);
  std::vector<Helper> helpers_ ABSL_GUARDED_BY(mu_);
  bool all_small_ ABSL_GUARDED_BY(mu_) = true;  // every helper in helpers_ is small

  // Every call is done, or a helper waits to run.
  bool DoneOrHelp() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CALL_GROUP_H_
