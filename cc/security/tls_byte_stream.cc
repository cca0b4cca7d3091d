#include "cc/security/tls_byte_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/status_macros.h"
#include "cc/security/bulk_aead.h"
#include "cc/security/bulk_aead_choice.h"

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

// TLS 1.3's AES-GCM suites, the one this side prefers first.
constexpr char kCipherSuites[] = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";
// OpenSSL's read-ahead buffer: one recv() takes up to this many bytes of
// records (256 KiB measured no better in CPU seconds: the records are
// decrypted in place and copied out, and 64 KiB stays in the L2 cache).
constexpr int kReadBufferBytes = 64 * 1024;

// The in-band switch to the AEAD layer (bulk_aead.h): the client sends it
// as its first TLS data when the server's OpenChannelResponse offers the
// layer; the server answers with the same bytes; then both ends seal with
// keys exported from this TLS session. A client that does not send it
// (older, or the layer off or unavailable on its side) stays on TLS
// records: its first bytes are a hello frame ("PSB1..."), never these.
constexpr char kAeadSwitch[8] = {'P', 'S', 'A', 'E', 'A', 'D', '0', '1'};
// RFC 8446 7.5 exporter label, and one context per direction.
constexpr char kAeadLabel[] = "EXPORTER-pserver-bulk-aead";
constexpr char kClientToServer[] = "client to server";
constexpr char kServerToClient[] = "server to client";

// A context for one connection, the files read now (rotation for free).
absl::StatusOr<CtxPtr> MakeContext(const TlsOptions& options, bool server) {
  CtxPtr ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) return TlsError("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(ctx.get(), kCipherSuites);
  // AES-128-GCM whatever order the client lists them in (10 AES rounds to
  // AES-256's 14); a client that allows only AES-256-GCM still gets it.
  if (server) SSL_CTX_set_options(ctx.get(), SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_num_tickets(ctx.get(), 0);  // no post-handshake records to read
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read what the socket holds, not a record header and then its body: half
  // the recv() calls, and whole 64 KiB reads under load.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), kReadBufferBytes);
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

// A socket BIO of our own: OpenSSL's writes with write(), which raises
// SIGPIPE when the peer has hung up (fatal for a library user's process);
// this one sends with MSG_NOSIGNAL, so a hang-up fails the call (EPIPE) and
// costs no signal-mask system calls on each record.
int SocketOf(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

bool Transient(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

int BioWrite(BIO* bio, const char* data, size_t size, size_t* written) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = send(SocketOf(bio), data, size, MSG_NOSIGNAL);
  if (n >= 0) {
    *written = static_cast<size_t>(n);
    return 1;
  }
  if (Transient(errno)) {
    BIO_set_retry_write(bio);
  } else {
    ERR_raise_data(ERR_LIB_SYS, errno, "send");
  }
  return 0;
}

int BioRead(BIO* bio, char* data, size_t size, size_t* read) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = recv(SocketOf(bio), data, size, 0);
  if (n > 0) {
    *read = static_cast<size_t>(n);
    return 1;
  }
  if (n < 0 && Transient(errno)) {
    BIO_set_retry_read(bio);
  } else if (n < 0) {
    ERR_raise_data(ERR_LIB_SYS, errno, "recv");
  }
  return 0;  // n == 0: the peer closed the connection
}

long BioControl(BIO* bio, int command, long, void* pointer) {
  switch (command) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_C_GET_FD:
      if (pointer != nullptr) *static_cast<int*>(pointer) = SocketOf(bio);
      return SocketOf(bio);
    default:
      return 0;
  }
}

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "pserver socket");
    if (m == nullptr) return static_cast<BIO_METHOD*>(nullptr);
    BIO_meth_set_write_ex(m, BioWrite);
    BIO_meth_set_read_ex(m, BioRead);
    BIO_meth_set_ctrl(m, BioControl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

// Bytes of records gathered before a send(): one 16 KiB record per system
// call made loopback TCP spend more on segments than on data.
constexpr long kWriteBufferBytes = 256 * 1024;

// Attaches `fd` to `ssl` through SocketMethod(): reads straight from the
// socket, writes through a buffer that TlsStream flushes after each Write.
// False when OpenSSL cannot.
bool AttachSocket(SSL* ssl, int fd) {
  const BIO_METHOD* method = SocketMethod();
  if (method == nullptr) return false;
  BIO* socket_bio = BIO_new(method);
  if (socket_bio == nullptr) return false;
  BIO_set_data(socket_bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO* buffer = BIO_new(BIO_f_buffer());
  if (buffer == nullptr || BIO_set_write_buffer_size(buffer, kWriteBufferBytes) != 1 ||
      BIO_up_ref(socket_bio) != 1) {
    BIO_free(buffer);
    BIO_free(socket_bio);
    return false;
  }
  BIO_push(buffer, socket_bio);
  SSL_set_bio(ssl, socket_bio, buffer);  // ssl owns both references now
  return true;
}

// The names of `ssl`'s verified peer certificate (empty without one), in
// gRPC's form: x509_common_name, and x509_subject_alternative_name for DNS,
// URI and email names and IP addresses (in text).
CertNames PeerNames(SSL* ssl) {
  CertNames names;
  if (SSL_get_verify_result(ssl) != X509_V_OK) return names;
  std::unique_ptr<X509, decltype(&X509_free)> cert(SSL_get1_peer_certificate(ssl), X509_free);
  if (cert == nullptr) return names;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const int cn = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (cn >= 0) {
    const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, cn));
    names.common_name.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                             ASN1_STRING_length(data));
  }
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
    if (name->type == GEN_DNS || name->type == GEN_URI || name->type == GEN_EMAIL) {
      const ASN1_IA5STRING* text = name->d.ia5;
      names.alt_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                                   ASN1_STRING_length(text));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      char text[INET6_ADDRSTRLEN];
      const int family = ASN1_STRING_length(ip) == 4 ? AF_INET : AF_INET6;
      if ((ASN1_STRING_length(ip) == 4 || ASN1_STRING_length(ip) == 16) &&
          inet_ntop(family, ASN1_STRING_get0_data(ip), text, sizeof(text)) != nullptr) {
        names.alt_names.emplace_back(text);
      }
    }
  }
  GENERAL_NAMES_free(sans);
  return names;
}

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
      if (!WaitForSocket(fd_, events, deadline)) {
        return absl::DeadlineExceededError(absl::StrCat("bulk channel TLS: ", what, " timed out"));
      }
    }
  }

  absl::Status Write(absl::Span<const absl::string_view> parts) override {
    if (aead_ != nullptr) return aead_->Write(parts);
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
    return Flush();
  }

  // Sends what the write buffer holds.
  absl::Status Flush() {
    while (true) {
      bool retry;
      {
        absl::MutexLock lock(&mu_);
        if (shut_down_) return absl::UnavailableError("bulk channel TLS: stream shut down");
        ERR_clear_error();
        BIO* out = SSL_get_wbio(ssl_.get());
        if (BIO_flush(out) > 0) return absl::OkStatus();
        retry = BIO_should_retry(out);
      }
      if (!retry) return TlsError("write");
      WaitForSocket(fd_, POLLOUT, absl::InfiniteFuture());
    }
  }

  absl::Status Read(char* dest, size_t n) override {
    size_t done = 0;
    if (!pending_.empty()) {  // what the server read looking for the switch
      done = std::min(n, pending_.size());
      std::memcpy(dest, pending_.data(), done);
      pending_.erase(0, done);
    }
    if (aead_ != nullptr) return aead_->Read(dest + done, n - done);
    return ReadTls(dest + done, n - done, SocketReceiveDeadline(fd_));
  }

  // Reads exactly `n` bytes of TLS records by `deadline`.
  absl::Status ReadTls(char* dest, size_t n, absl::Time deadline) {
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

  // The verified peer certificate's names (PeerNames).
  CertNames Peer() {
    absl::MutexLock lock(&mu_);
    return PeerNames(ssl_.get());
  }

  // The negotiated suite's standard name.
  std::string CipherSuite() {
    absl::MutexLock lock(&mu_);
    const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl_.get());
    return cipher == nullptr ? "" : SSL_CIPHER_standard_name(cipher);
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      shut_down_ = true;
    }
    if (aead_ != nullptr) aead_->Shutdown();
    shutdown(fd_, SHUT_RDWR);  // wakes any poll
  }

  // The client's side of the switch to the AEAD layer, by `deadline`.
  absl::Status SwitchToAeadAsClient(absl::Time deadline) {
    PS_RETURN_IF_ERROR(Write({absl::string_view(kAeadSwitch, sizeof(kAeadSwitch))}));
    char answer[sizeof(kAeadSwitch)];
    PS_RETURN_IF_ERROR(ReadTls(answer, sizeof(answer), deadline));
    if (std::memcmp(answer, kAeadSwitch, sizeof(answer)) != 0) {
      return absl::UnavailableError("bulk channel TLS: the server did not accept the AEAD switch");
    }
    return StartAead(/*server=*/false);
  }

  // The server's side: the client's first 8 bytes by `deadline`; the switch
  // is answered and started, anything else is kept for Read.
  absl::Status AnswerAeadSwitch(absl::Time deadline) {
    char first[sizeof(kAeadSwitch)];
    PS_RETURN_IF_ERROR(ReadTls(first, sizeof(first), deadline));
    if (std::memcmp(first, kAeadSwitch, sizeof(first)) != 0) {
      pending_.assign(first, sizeof(first));
      return absl::OkStatus();
    }
    PS_RETURN_IF_ERROR(Write({absl::string_view(kAeadSwitch, sizeof(kAeadSwitch))}));
    return StartAead(/*server=*/true);
  }

  bool UsesAead() const { return aead_ != nullptr; }
  std::unique_ptr<FrameWriter> StartSealedFrame(uint64_t head_bytes, uint64_t frame_bytes) {
    return aead_ == nullptr ? nullptr : aead_->StartFrame(head_bytes, frame_bytes);
  }
  // Short fingerprints of the send and receive keys (SHA-256 of key and
  // nonce prefix, 8 bytes in hex), for tests.
  std::pair<std::string, std::string> AeadKeyIds() const { return key_ids_; }

 private:
  // Keys from the TLS exporter; the AEAD layer from now on. Both ends must
  // have read every TLS record the other sent: bytes OpenSSL holds unread
  // now would be lost, so they fail the switch.
  absl::Status StartAead(bool server) {
    AeadKeys client_to_server;
    AeadKeys server_to_client;
    {
      absl::MutexLock lock(&mu_);
      if (SSL_has_pending(ssl_.get())) {
        return absl::UnavailableError(
            "bulk channel TLS: TLS data after the AEAD switch; closing the connection");
      }
      PS_RETURN_IF_ERROR(ExportKeys(kClientToServer, &client_to_server));
      PS_RETURN_IF_ERROR(ExportKeys(kServerToClient, &server_to_client));
    }
    const AeadKeys& send = server ? server_to_client : client_to_server;
    const AeadKeys& receive = server ? client_to_server : server_to_client;
    key_ids_ = {KeyId(send), KeyId(receive)};
    aead_ = std::make_unique<AeadStream>(fd_, send, receive);
    OPENSSL_cleanse(&client_to_server, sizeof(client_to_server));
    OPENSSL_cleanse(&server_to_client, sizeof(server_to_client));
    return absl::OkStatus();
  }

  absl::Status ExportKeys(absl::string_view context, AeadKeys* keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    unsigned char material[kAeadKeyBytes + kAeadNoncePrefixBytes];
    if (SSL_export_keying_material(ssl_.get(), material, sizeof(material), kAeadLabel,
                                   sizeof(kAeadLabel) - 1,
                                   reinterpret_cast<const unsigned char*>(context.data()),
                                   context.size(), 1) != 1) {
      return TlsError("exporting the bulk AEAD keys");
    }
    std::memcpy(keys->key, material, kAeadKeyBytes);
    std::memcpy(keys->nonce_prefix, material + kAeadKeyBytes, kAeadNoncePrefixBytes);
    OPENSSL_cleanse(material, sizeof(material));
    return absl::OkStatus();
  }

  static std::string KeyId(const AeadKeys& keys) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_Digest(&keys, sizeof(keys), digest, &size, EVP_sha256(), nullptr);
    return absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(digest), std::min(size, 8u)));
  }

  const int fd_;
  CtxPtr ctx_;
  absl::Mutex mu_;
  SslPtr ssl_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Set during the handshake, before the stream is handed out.
  std::string pending_;
  std::unique_ptr<AeadStream> aead_;
  std::pair<std::string, std::string> key_ids_;
};

absl::StatusOr<std::unique_ptr<ByteStream>> Handshake(int fd, const TlsOptions& options,
                                                      const std::string* host,
                                                      absl::Time deadline,
                                                      CertNames* peer = nullptr,
                                                      bool server_offers_aead = false) {
  const bool server = host == nullptr;
  absl::StatusOr<CtxPtr> ctx = MakeContext(options, server);
  if (!ctx.ok()) {
    close(fd);
    return ctx.status();
  }
  SslPtr ssl(SSL_new(ctx->get()));
  if (ssl == nullptr || !AttachSocket(ssl.get(), fd)) {
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
  // The server asks for the switch only when it offers the layer; the
  // client makes it only when the server offered it and it can itself.
  const bool aead =
      UseBulkAead(options, server ? "server" : "client") && (server || server_offers_aead);
  // The client reads the server's answer record alone (no read-ahead), so
  // that no AEAD bytes after it end up in OpenSSL's buffer.
  if (aead && !server) SSL_set_read_ahead(ssl.get(), 0);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto stream = std::make_unique<TlsStream>(fd, *std::move(ctx), std::move(ssl));
  const absl::Status handshake =
      stream->Run([server](SSL* s) { return server ? SSL_accept(s) : SSL_connect(s); },
                  server ? "handshake with a client" : "handshake with the server", deadline);
  if (!handshake.ok()) return handshake;
  if (aead) {
    PS_RETURN_IF_ERROR(server ? stream->AnswerAeadSwitch(deadline)
                              : stream->SwitchToAeadAsClient(deadline));
  }
  if (peer != nullptr) *peer = stream->Peer();
  return std::unique_ptr<ByteStream>(std::move(stream));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsServer(int fd, const TlsOptions& options,
                                                           absl::Time deadline, CertNames* peer) {
  return Handshake(fd, options, nullptr, deadline, peer);
}

std::string TlsCipherSuite(ByteStream& stream) {
  auto* tls = dynamic_cast<TlsStream*>(&stream);
  return tls == nullptr ? "" : tls->CipherSuite();
}

bool TlsUsesBulkAead(ByteStream& stream) {
  auto* tls = dynamic_cast<TlsStream*>(&stream);
  return tls != nullptr && tls->UsesAead();
}

std::unique_ptr<FrameWriter> StartSealedFrame(ByteStream& stream, uint64_t head_bytes,
                                              uint64_t frame_bytes) {
  auto* tls = dynamic_cast<TlsStream*>(&stream);
  return tls == nullptr ? nullptr : tls->StartSealedFrame(head_bytes, frame_bytes);
}

std::pair<std::string, std::string> BulkAeadKeyIds(ByteStream& stream) {
  auto* tls = dynamic_cast<TlsStream*>(&stream);
  return tls == nullptr ? std::pair<std::string, std::string>() : tls->AeadKeyIds();
}

absl::StatusOr<std::unique_ptr<ByteStream>> StartTlsClient(std::unique_ptr<ByteStream> tcp,
                                                           const TlsOptions& options,
                                                           const std::string& host,
                                                           absl::Time deadline,
                                                           bool server_offers_aead) {
  auto* socket = dynamic_cast<SocketStream*>(tcp.get());
  if (socket == nullptr) return absl::InternalError("bulk channel TLS needs a socket stream");
  const int fd = dup(socket->fd());
  if (fd < 0) return absl::UnavailableError("bulk channel TLS: dup failed");
  tcp.reset();
  return Handshake(fd, options, &host, deadline, nullptr, server_offers_aead);
}

}  // namespace pserver
