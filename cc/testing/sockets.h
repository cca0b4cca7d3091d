// This process's sockets, looked at from a test: which TCP sockets are
// connected to a port, and a socket's TCP_NOTSENT_LOWAT.
//
//   for (int fd : TcpSocketsConnectedTo(listener_port)) {
//     EXPECT_EQ(UnsentBytesLimitOf(fd), 128 << 10);
//   }
//
// Thread-safe (reads only).
#ifndef PSERVER_CC_TESTING_SOCKETS_H_
#define PSERVER_CC_TESTING_SOCKETS_H_

#include <vector>

namespace pserver {

// This process's TCP sockets whose peer is `port` (IPv4 or IPv6): a
// client's connections to a listener on that port, from /proc/self/fd.
std::vector<int> TcpSocketsConnectedTo(int port);

// `fd`'s TCP_NOTSENT_LOWAT: 0 when unset (the kernel's default applies),
// -1 when the socket has no such option (not TCP).
int UnsentBytesLimitOf(int fd);

}  // namespace pserver

#endif  // PSERVER_CC_TESTING_SOCKETS_H_
