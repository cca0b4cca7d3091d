#include "cc/security/tls_byte_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace pserver {
namespace {

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;
using SslPtr = std::unique_ptr<SSL, SslFree>;

// OpenSSL's queued errors in words (and the queue emptied).
std::string OpenSslErrors() {
  std::string text;
  while (unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    absl::StrAppend(&text, text.empty() ? "" : "; ", buffer);
  }
  return text.empty() ? "connection closed" : text;
}

absl::Status TlsError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("bulk channel TLS: ", what, ": ", OpenSslErrors()));
}

// A context for one connection, the files read now (rotation for free).
absl::StatusOr<CtxPtr> MakeContext(const TlsOptions& options, bool server) {
  CtxPtr ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) return TlsError("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(ctx.get(), "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384");
  SSL_CTX_set_num_tickets(ctx.get(), 0);  // no post-handshake records to read
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), options.cert.c_str()) != 1) {
    return TlsError(absl::StrCat("cannot load certificate ", options.cert));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), options.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return TlsError(absl::StrCat("cannot load key ", options.key));
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), options.ca.c_str(), nullptr) != 1) {
    return TlsError(absl::StrCat("cannot load CA ", options.ca));
  }
  SSL_CTX_set_verify(ctx.get(),
                     server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER,
                     nullptr);
  return ctx;
}

// Waits until `fd` is ready for `events` or `deadline` (InfiniteFuture: no
// limit). False on timeout.
bool Wait(int fd, short events, absl::Time deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now() +
                                                         absl::Milliseconds(1) - absl::Nanoseconds(1))));
    }
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the OpenSSL call report it
  }
}

// The deadline a blocking read on `fd` would have (SO_RCVTIMEO).
absl::Time ReceiveDeadline(int fd) {
  timeval tv{};
  socklen_t size = sizeof(tv);
  if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &size) != 0 ||
      (tv.tv_sec == 0 && tv.tv_usec == 0)) {
    return absl::InfiniteFuture();
  }
  return absl::Now() + absl::DurationFromTimeval(tv);
}

// Blocks SIGPIPE on this thread while OpenSSL may write to a socket whose
// peer has closed it (OpenSSL's socket BIO calls write(), not send() with
// MSG_NOSIGNAL), and consumes a SIGPIPE raised meanwhile: a peer that hangs
// up must fail the call (EPIPE), not kill the process.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~ScopedNoSigpipe() {
    if (!blocked_) return;
    if (!was_pending_) {
      const struct timespec zero = {0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);  // ours, if one was raised
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

class TlsStream final : public ByteStream {
 public:
  TlsStream(int fd, CtxPtr ctx, SslPtr ssl)
      : fd_(fd), ctx_(std::move(ctx)), ssl_(std::move(ssl)) {}
  ~TlsStream() override { close(fd_); }

  // Runs `op` (an OpenSSL call on ssl_) until it succeeds, waiting outside
  // the lock for what OpenSSL asks for. `what` names it in errors.
  absl::Status Run(const std::function<int(SSL*)>& op, absl::string_view what,
                   absl::Time deadline) {
    while (true) {
      int result;
      int error;
      {
        absl::MutexLock lock(&mu_);
        if (shut_down_) return absl::UnavailableError("bulk channel TLS: stream shut down");
        ERR_clear_error();
        ScopedNoSigpipe no_sigpipe;
        result = op(ssl_.get());
        error = result > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_.get(), result);
      }
      if (error == SSL_ERROR_NONE) return absl::OkStatus();
      short events;
      if (error == SSL_ERROR_WANT_READ) {
        events = POLLIN;
      } else if (error == SSL_ERROR_WANT_WRITE) {
        events = POLLOUT;
      } else {
        return TlsError(what);
      }
      if (!Wait(fd_, events, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat("bulk channel TLS: ", what, " timed out"));
      }
    }
  }

  absl::Status Write(absl::Span<const absl::string_view> parts) override {
    for (absl::string_view part : parts) {
      size_t done = 0;
      while (done < part.size()) {
        size_t written = 0;
        absl::Status status = Run(
            [&](SSL* ssl) {
              return SSL_write_ex(ssl, part.data() + done, part.size() - done, &written);
            },
            "write", absl::InfiniteFuture());
        if (!status.ok()) return status;
        done += written;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Read(char* dest, size_t n) override {
    const absl::Time deadline = ReceiveDeadline(fd_);
    size_t done = 0;
    while (done < n) {
      size_t read = 0;
      absl::Status status = Run(
          [&](SSL* ssl) { return SSL_read_ex(ssl, dest + done, n - done, &read); }, "read",
          deadline);
      if (!status.ok()) return status;
      done += read;
    }
    return absl::OkStatus();
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      shut_down_ = true;
    }
    shutdown(fd_, SHUT_RDWR);  // wakes any poll
  }

 private:
  const int fd_;
  CtxPtr ctx_;
  absl::Mutex mu_;
  SslPtr ssl_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<ByteStream>> Handshake(int fd, const TlsOptions& options,
                                                      const std::string* host,
                                                      absl::Time deadline) {
  const bool server = host == nullptr;
  absl::StatusOr<CtxPtr> ctx = MakeContext(options, server);
  if (!ctx.ok()) {
    close(fd);
    return ctx.status();
  }
  SslPtr ssl(SSL_new(ctx->get()));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) {
    close(fd);
    return TlsError("SSL_new");
  }
  if (!server) {
    const std::string& name = options.server_name.empty() ? *host : options.server_name;
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
    in6_addr ip;
    const bool is_ip = inet_pton(AF_INET, name.c_str(), &ip) == 1 ||
                       inet_pton(AF_INET6, name.c_str(), &ip) == 1;
    if (is_ip) {
      X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
      SSL_set_tlsext_host_name(ssl.get(), name.c_str());
    }
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto stream = std::make_unique<TlsStream>(fd, *std::move(ctx), std::move(ssl));
  const absl::Status handshake =
      stream->Run([server](SSL* s) { return server ? SSL_accept(s) : SSL_connect(s); },
                  server ? "handshake with a client" : "handshake with the server", deadline);
  if (!handshake.ok()) return handshake;
  return std::unique_ptr<ByteStream>(std::move(stream));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsServer(int fd, const TlsOptions& options,
                                                           absl::Time deadline) {
  return Handshake(fd, options, nullptr, deadline);
}

absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsClient(std::unique_ptr<ByteStream> tcp,
                                                           const TlsOptions& options,
                                                           const std::string& host,
                                                           absl::Time deadline) {
  auto* socket = dynamic_cast<SocketStream*>(tcp.get());
  if (socket == nullptr) return absl::InternalError("bulk channel TLS needs a socket stream");
  const int fd = dup(socket->fd());
  if (fd < 0) return absl::UnavailableError("bulk channel TLS: dup failed");
  tcp.reset();
  return Handshake(fd, options, &host, deadline);
}

}  // namespace pserver
