// ReduceOp: how an all-reduce combines the workers' contributions. Its own
// header so that a client names it without linking the collectives.
#ifndef PSERVER_CC_CORE_REDUCE_OP_H_
#define PSERVER_CC_CORE_REDUCE_OP_H_

namespace pserver {

enum class ReduceOp { kSum, kMean };

}  // namespace pserver

#endif  // PSERVER_CC_CORE_REDUCE_OP_H_
