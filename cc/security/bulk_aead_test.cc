// The AEAD record layer on its own over socket pairs: bytes written in
// records of every size arrive whole and in order both ways, whichever way
// the reader cuts its reads; and what an attacker on the wire can do to the
// records (flip a bit of a header, a ciphertext or a tag, replay, reorder,
// cut short, send an oversized length, use another direction's key) is
// refused, the stream closed and nothing of the record delivered.

#include "cc/security/bulk_aead.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::testing::HasSubstr;

AeadKeys Keys(uint8_t seed) {
  AeadKeys keys;
  for (size_t i = 0; i < kAeadKeyBytes; ++i) keys.key[i] = static_cast<uint8_t>(seed + 7 * i);
  for (size_t i = 0; i < kAeadNoncePrefixBytes; ++i) keys.nonce_prefix[i] = seed;
  return keys;
}

// A connected, non-blocking socket pair.
struct Pair {
  int fd[2] = {-1, -1};
  Pair() {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0);
    for (int f : fd) fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
  }
  ~Pair() {
    for (int f : fd) close(f);
  }
};

// A connected, non-blocking TCP pair on 127.0.0.1 with the bulk channel's
// socket buffers (TCP segments and wake-ups, unlike a Unix socket pair).
struct TcpPair {
  int fd[2] = {-1, -1};
  TcpPair() {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), size), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size), 0);
    fd[0] = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(fd[0], reinterpret_cast<sockaddr*>(&address), size), 0);
    fd[1] = accept(listener, nullptr, nullptr);
    close(listener);
    for (int f : fd) {
      SetSocketBuffers(f);
      fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
    }
  }
  ~TcpPair() {
    for (int f : fd) {
      if (f >= 0) close(f);
    }
  }
};

std::string Pattern(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

// Reads everything written to raw socket `fd` until `expected` bytes came.
std::string Drain(int fd, size_t expected) {
  std::string bytes;
  char buffer[65536];
  for (int spins = 0; bytes.size() < expected && spins < 1000000; ++spins) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      bytes.append(buffer, static_cast<size_t>(n));
    } else {
      WaitForSocket(fd, POLLIN, absl::Now() + absl::Seconds(60));
    }
  }
  return bytes;
}

// The wire bytes of the records `writer` makes of each string in `messages`
// (one Write each), sealed with Keys(1).
std::vector<std::string> Seal(const std::vector<std::string>& messages,
                              const AeadKeys& send = Keys(1)) {
  Pair pair;
  AeadStream writer(pair.fd[0], send, Keys(2));
  std::vector<std::string> records;
  for (const std::string& message : messages) {
    std::thread writing([&] { EXPECT_OK(writer.Write({absl::string_view(message)})); });
    records.push_back(Drain(pair.fd[1], kAeadHeaderBytes + message.size() + kAeadTagBytes));
    writing.join();
  }
  return records;
}

// The records of `wire` (as Seal gives it), each with header and tag.
std::vector<std::string> SplitRecords(absl::string_view wire) {
  std::vector<std::string> records;
  while (wire.size() >= kAeadHeaderBytes) {
    uint32_t size = 0;
    std::memcpy(&size, wire.data(), 4);  // little-endian host
    const size_t record = std::min(wire.size(), kAeadHeaderBytes + size + kAeadTagBytes);
    records.emplace_back(wire.substr(0, record));
    wire.remove_prefix(record);
  }
  return records;
}

void WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno != EAGAIN) {
      return;  // the reader closed the connection
    } else {
      WaitForSocket(fd, POLLOUT, absl::Now() + absl::Seconds(60));
    }
  }
}

// Delivers `wire` to a reader keyed to open what Seal made and reads
// `size` bytes: the status, and whether anything but zeros landed.
struct Delivery {
  absl::Status status;
  std::string read;
};
Delivery Deliver(const std::string& wire, size_t size, bool close_after = true,
                 AeadKeys receive = Keys(1)) {
  Pair pair;
  AeadStream reader(pair.fd[1], Keys(2), receive);
  std::thread writing([&] {
    WriteAll(pair.fd[0], wire);
    if (close_after) shutdown(pair.fd[0], SHUT_WR);
  });
  Delivery delivery;
  delivery.read.assign(size, 'x');
  delivery.status = reader.Read(delivery.read.data(), size);
  reader.Shutdown();  // a writer still blocked on a full socket fails now
  writing.join();
  return delivery;
}

TEST(BulkAeadTest, TheCpuHasAesNiForIpsecMb) {
  // This machine (and CI) has AES-NI; without it the layer is never offered.
  EXPECT_TRUE(BulkAeadAvailable());
  EXPECT_NE(BulkAeadArch(), "none");
}

TEST(BulkAeadTest, RecordsOfEverySizeArriveWholeAndInOrderBothWays) {
  Pair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  AeadStream b(pair.fd[1], Keys(2), Keys(1));
  const std::vector<size_t> sizes = {1,         15,          16,          17,       1000,
                                     65535,     65536,       65537,       262147,   1 << 20,
                                     (1 << 20) + 1, 3 * (1 << 20) + 7, 16 << 20};
  std::string all;
  for (size_t i = 0; i < sizes.size(); ++i) all += Pattern(sizes[i], static_cast<uint32_t>(i));
  // a -> b: one Write per size with a small first part (as a frame header);
  // b reads in pieces of other sizes (partly buffered, partly in place).
  std::thread writer([&] {
    size_t offset = 0;
    for (size_t size : sizes) {
      const absl::string_view chunk(all.data() + offset, size);
      const size_t head = std::min<size_t>(size, 32);
      EXPECT_OK(a.Write({chunk.substr(0, head), chunk.substr(head)}));
      offset += size;
    }
  });
  std::string got(all.size(), '\0');
  size_t done = 0;
  for (size_t piece = 7; done < got.size(); piece = piece * 3 + 1) {
    const size_t n = std::min(got.size() - done, piece % (5 << 20) + 1);
    ASSERT_OK(b.Read(got.data() + done, n));
    done += n;
  }
  writer.join();
  EXPECT_TRUE(got == all);
  // b -> a, read exactly as written.
  std::thread back([&] { EXPECT_OK(b.Write({absl::string_view(all)})); });
  std::string echoed(all.size(), '\0');
  ASSERT_OK(a.Read(echoed.data(), echoed.size()));
  back.join();
  EXPECT_TRUE(echoed == all);
}

TEST(BulkAeadTest, OverTcpARecordsLastBytesAreTakenWithoutWaitingForMore) {
  // A record whose rest is shorter than a receive piece (or than the tag
  // and next header its last piece asks for), and nothing after it, must
  // still be read at once: each Write here is read before the next is made,
  // so a reader waiting for more than the record owes would time out.
  TcpPair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  AeadStream b(pair.fd[1], Keys(2), Keys(1));
  timeval tv{20, 0};  // generous on a loaded machine; a reader waiting for more waits forever
  ASSERT_EQ(setsockopt(pair.fd[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  uint32_t seed = 0;
  for (size_t size : {size_t{5}, size_t{70000}, size_t{100 << 10}, size_t{300 << 10},
                      size_t{1 << 20}, (size_t{1} << 20) + 5, size_t{3} << 20}) {
    const std::string message = Pattern(size, ++seed);
    std::thread writer([&] { EXPECT_OK(a.Write({absl::string_view(message)})); });
    std::string got(size, '\0');
    ASSERT_OK(b.Read(got.data(), got.size())) << size;
    writer.join();
    EXPECT_TRUE(got == message) << size;
  }
}

TEST(BulkAeadTest, OverTcpManyFramesOfManyRecordsArriveWholeAndInOrder) {
  // A frame (header part + payload) split into many records, frames back to
  // back with the reader behind: pieces, tails with their tag and the next
  // header, and small records all come through the same socket.
  TcpPair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  AeadStream b(pair.fd[1], Keys(2), Keys(1));
  std::vector<std::string> frames;
  for (uint32_t i = 0; i < 6; ++i) frames.push_back(Pattern((i + 1) * 777777 + i, 100 + i));
  std::thread writer([&] {
    for (const std::string& frame : frames) {
      const absl::string_view all(frame);
      EXPECT_OK(a.Write({all.substr(0, 40), all.substr(40)}));
    }
  });
  for (const std::string& frame : frames) {
    std::string head(40, '\0');
    std::string payload(frame.size() - 40, '\0');
    ASSERT_OK(b.Read(head.data(), head.size()));
    ASSERT_OK(b.Read(payload.data(), payload.size()));
    EXPECT_TRUE(head + payload == frame);
  }
  writer.join();
}

TEST(BulkAeadTest, ARecordSplicedInFromAnotherConnectionIsRefusedAndNothingOfItDelivered) {
  // Two connections (other keys) each send a frame of two records; the
  // second record of one spliced in place of the other's: its first record
  // is genuine and delivered, the spliced one fails its tag and nothing of
  // it reaches the reader.
  const std::string message = Pattern(kSealRecordBytes + 1000, 5);
  const std::vector<std::string> ours = SplitRecords(Seal({message}, Keys(1))[0]);
  const std::vector<std::string> theirs = SplitRecords(Seal({message}, Keys(3))[0]);
  ASSERT_EQ(ours.size(), 2u);
  ASSERT_EQ(theirs.size(), 2u);
  ASSERT_EQ(ours[1].size(), theirs[1].size());
  ASSERT_NE(ours[1], theirs[1]);
  const Delivery genuine = Deliver(ours[0] + ours[1], message.size());
  ASSERT_OK(genuine.status);
  EXPECT_TRUE(genuine.read == message);
  const Delivery spliced = Deliver(ours[0] + theirs[1], message.size());
  EXPECT_THAT(spliced.status, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(spliced.status.message(), HasSubstr("failed authentication"));
  EXPECT_EQ(spliced.read.substr(0, kSealRecordBytes), message.substr(0, kSealRecordBytes));
  EXPECT_EQ(spliced.read.find_first_not_of('\0', kSealRecordBytes), std::string::npos);
}

// The record sizes of `wire`, from their headers.
std::vector<size_t> RecordSizes(absl::string_view wire) {
  std::vector<size_t> sizes;
  for (const std::string& record : SplitRecords(wire)) {
    sizes.push_back(record.size() - kAeadHeaderBytes - kAeadTagBytes);
  }
  return sizes;
}

TEST(BulkAeadTest, AWritesFirstPartIsARecordOfItsOwnAndTheRestIsCutEveryRecordSize) {
  // A frame: its header, then payload parts of every size (empty ones
  // too); the payload's records span parts and end every kSealRecordBytes.
  const std::string header = Pattern(40, 1);
  const std::vector<std::string> payload = {Pattern(100, 2), Pattern(400 << 10, 3), "",
                                            Pattern(5, 4), Pattern(200 << 10, 5), Pattern(1, 6)};
  Pair pair;
  AeadStream writer(pair.fd[0], Keys(1), Keys(2));
  std::vector<absl::string_view> parts = {header};
  size_t payload_bytes = 0;
  for (const std::string& part : payload) {
    parts.push_back(part);
    payload_bytes += part.size();
  }
  std::thread writing([&] { EXPECT_OK(writer.Write(parts)); });
  const std::string wire = Drain(pair.fd[1], header.size() + payload_bytes + 4 * (kAeadHeaderBytes + kAeadTagBytes));
  writing.join();
  const std::vector<size_t> expected = {40, kSealRecordBytes, kSealRecordBytes,
                                        payload_bytes - 2 * kSealRecordBytes};
  EXPECT_EQ(RecordSizes(wire), expected);
  // The same records read back whole.
  std::string all = header;
  for (const std::string& part : payload) all += part;
  const Delivery delivery = Deliver(wire, all.size());
  ASSERT_OK(delivery.status);
  EXPECT_TRUE(delivery.read == all);
}

TEST(BulkAeadTest, AWriteOfOnlyAHeaderOrOfNothingMakesNoEmptyRecord) {
  const std::vector<std::string> wire = Seal({"just a header"});
  EXPECT_EQ(RecordSizes(wire[0]), std::vector<size_t>{13});
  Pair pair;
  AeadStream writer(pair.fd[0], Keys(1), Keys(2));
  ASSERT_OK(writer.Write({}));
  ASSERT_OK(writer.Write({"", ""}));
  char byte;
  EXPECT_EQ(read(pair.fd[1], &byte, 1), -1);  // nothing was sent
  EXPECT_EQ(errno, EAGAIN);
}

TEST(BulkAeadTest, APayloadReadInPiecesOfTheRecordSizeIsDecryptedWhereItLands) {
  // As the bulk listener reads a large push: the frame header, then the
  // payload in kSealRecordBytes pieces. Each piece is whole records, so
  // nothing goes through the reader's buffer; a reader whose pieces cut
  // records still gets every byte, through the buffer.
  TcpPair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  AeadStream b(pair.fd[1], Keys(2), Keys(1));
  const std::string header = Pattern(40, 7);
  const std::string prefix = Pattern(23, 8);
  const std::string body = Pattern((3 << 20) + 11, 9);
  const std::string payload = prefix + body;
  for (const size_t piece : {kSealRecordBytes, kSealRecordBytes / 2 + 3}) {
    const uint64_t buffered_before = b.buffered_record_bytes();
    std::thread writer([&] { EXPECT_OK(a.Write({header, prefix, body})); });
    std::string got_header(header.size(), '\0');
    ASSERT_OK(b.Read(got_header.data(), got_header.size()));
    std::string got(payload.size(), '\0');
    for (size_t done = 0; done < got.size();) {
      const size_t n = std::min(piece, got.size() - done);
      ASSERT_OK(b.Read(got.data() + done, n));
      done += n;
    }
    writer.join();
    EXPECT_EQ(got_header, header);
    EXPECT_TRUE(got == payload) << piece;
    if (piece == kSealRecordBytes) {
      EXPECT_EQ(b.buffered_record_bytes(), buffered_before);
    } else {
      EXPECT_GT(b.buffered_record_bytes(), buffered_before);
    }
  }
}

TEST(BulkAeadTest, APeerThatClosesInsideAFrameFailsTheWriterAndLaterWrites) {
  // The reader takes the header and a piece of a large frame, then closes:
  // the writer, still sending the frame, fails (nothing crashes or hangs),
  // and so does every later write.
  TcpPair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  auto b = std::make_unique<AeadStream>(pair.fd[1], Keys(2), Keys(1));
  const std::string frame = Pattern(64 << 20, 10);
  absl::Status written;
  std::thread writer([&] { written = a.Write({absl::string_view(frame).substr(0, 40),
                                              absl::string_view(frame).substr(40)}); });
  std::string got(40 + kSealRecordBytes, '\0');
  ASSERT_OK(b->Read(got.data(), got.size()));
  EXPECT_TRUE(got == frame.substr(0, got.size()));
  b.reset();
  close(pair.fd[1]);
  pair.fd[1] = -1;
  writer.join();
  EXPECT_THAT(written, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(a.Write({"after"}), StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST(BulkAeadTest, TheWireCarriesNoPlaintext) {
  const std::string message(4096, 'p');
  const std::vector<std::string> records = Seal({message});
  ASSERT_EQ(records[0].size(), kAeadHeaderBytes + message.size() + kAeadTagBytes);
  EXPECT_EQ(records[0].find("pppppppp"), std::string::npos);
  EXPECT_OK(Deliver(records[0], message.size()).status);
  EXPECT_EQ(Deliver(records[0], message.size()).read, message);
}

TEST(BulkAeadTest, AFlippedBitAnywhereIsRefusedAndNothingDelivered) {
  const std::string message = Pattern(1000, 9);
  const std::string record = Seal({message})[0];
  // Header (length, type, padding), ciphertext (first, middle, last), tag.
  const size_t tag = kAeadHeaderBytes + message.size();
  for (size_t at : {size_t{0}, size_t{1}, size_t{4}, size_t{7}, kAeadHeaderBytes, size_t{500},
                    tag - 1, tag, tag + kAeadTagBytes - 1}) {
    for (int bit : {0, 7}) {
      std::string tampered = record;
      tampered[at] = static_cast<char>(tampered[at] ^ (1 << bit));
      const Delivery delivery = Deliver(tampered, message.size());
      EXPECT_THAT(delivery.status, StatusCodeIs(absl::StatusCode::kUnavailable))
          << "byte " << at << " bit " << bit;
      EXPECT_EQ(delivery.read.find_first_not_of('\0'), std::string::npos)
          << "byte " << at << " bit " << bit << ": something of the record was delivered";
    }
  }
}

TEST(BulkAeadTest, AReplayedAReorderedAndADroppedRecordAreRefused) {
  const std::vector<std::string> records = Seal({"first record", "second record", "third one"});
  // Replayed: the first record twice.
  {
    Pair pair;
    AeadStream reader(pair.fd[1], Keys(2), Keys(1));
    WriteAll(pair.fd[0], records[0] + records[0]);
    char first[12];
    ASSERT_OK(reader.Read(first, sizeof(first)));
    EXPECT_EQ(absl::string_view(first, sizeof(first)), "first record");
    char again[12];
    EXPECT_THAT(reader.Read(again, sizeof(again)), StatusCodeIs(absl::StatusCode::kUnavailable));
    // The stream stays closed: the genuine next record is not taken either.
    WriteAll(pair.fd[0], records[1]);
    char second[13];
    EXPECT_THAT(reader.Read(second, sizeof(second)), StatusCodeIs(absl::StatusCode::kUnavailable));
  }
  // Reordered: the second before the first.
  Delivery reordered = Deliver(records[1] + records[0], 13);
  EXPECT_THAT(reordered.status, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(reordered.status.message(), HasSubstr("failed authentication"));
  // Dropped: the first and the third.
  Delivery dropped = Deliver(records[0] + records[2], 12 + 9);
  EXPECT_THAT(dropped.status, StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST(BulkAeadTest, ARecordCutShortIsRefused) {
  const std::string message = Pattern(200000, 3);  // one record, bigger than the read-ahead
  const std::string record = Seal({message})[0];
  for (size_t keep : {size_t{3}, kAeadHeaderBytes, size_t{100000}, record.size() - 1}) {
    const Delivery delivery = Deliver(record.substr(0, keep), message.size());
    EXPECT_THAT(delivery.status, StatusCodeIs(absl::StatusCode::kUnavailable)) << keep;
    EXPECT_THAT(delivery.status.message(), HasSubstr("cut short")) << keep;
    EXPECT_EQ(delivery.read.find_first_not_of('\0'), std::string::npos) << keep;
  }
}

TEST(BulkAeadTest, ALengthOverTheLimitOrAnUnknownTypeIsRefusedBeforeAnythingIsRead) {
  std::string header(kAeadHeaderBytes, '\0');
  const uint32_t size = kMaxAeadRecordBytes + 1;
  std::memcpy(header.data(), &size, 4);  // little-endian host
  header[4] = 1;
  Delivery oversized = Deliver(header, 16, /*close_after=*/false);
  EXPECT_THAT(oversized.status, StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(oversized.status.message(), HasSubstr("1048577 bytes"));
  header[0] = 16;
  header[1] = header[2] = header[3] = 0;
  header[4] = 2;
  Delivery unknown = Deliver(header, 16, /*close_after=*/false);
  EXPECT_THAT(unknown.status.message(), HasSubstr("unknown type"));
}

TEST(BulkAeadTest, RecordsSealedForTheOtherDirectionAreRefused) {
  const std::string record = Seal({"to the server"})[0];
  // A reader holding the other direction's keys (a reflected record).
  const Delivery reflected = Deliver(record, 13, true, Keys(2));
  EXPECT_THAT(reflected.status.message(), HasSubstr("failed authentication"));
}

TEST(BulkAeadTest, AReadThatTimesOutBeforeARecordLeavesTheStreamWhole) {
  Pair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  AeadStream b(pair.fd[1], Keys(2), Keys(1));
  timeval tv{0, 20000};
  ASSERT_EQ(setsockopt(pair.fd[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  char byte;
  EXPECT_THAT(b.Read(&byte, 1), StatusCodeIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK(a.Write({"z"}));
  ASSERT_OK(b.Read(&byte, 1));
  EXPECT_EQ(byte, 'z');
}

TEST(BulkAeadTest, WritingAfterShutdownFails) {
  Pair pair;
  AeadStream a(pair.fd[0], Keys(1), Keys(2));
  a.Shutdown();
  EXPECT_THAT(a.Write({"late"}), StatusCodeIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace pserver
