#include "cc/rpc/grpc_status.h"

namespace pserver {

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kInitialStreamWindowBytes);
  return args;
}

}  // namespace pserver
