#include "ucx/sockcm_guard.h"

#include <linux/filter.h>
#include <sys/socket.h>
#include <ucs/sys/string.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace tensorwire::ucx {

namespace {

// The kernel runs a TCP socket's filter with the packet starting at the TCP header
// (tcp_filter), and ends the program with "drop" on a load past the packet's end (none can
// happen here: the payload's length is checked first). The length is little-endian in
// bytes 0..7 of the payload; loads are big-endian, so the low two bytes are put together by
// hand and the higher six must be zero.
constexpr uint32_t kHeader = 16;  // sizeof(uct_tcp_sockcm_priv_data_hdr_t) on LP64

// Indices of the two exits, for the jumps below (jt / jf count instructions skipped).
constexpr uint8_t kDrop = 23, kAccept = 24;
constexpr uint8_t to(uint8_t target, uint8_t from) {
  return static_cast<uint8_t>(target - from - 1);
}

std::array<sock_filter, kAccept + 1> program(uint32_t max_length) {
  return {{
      /* 0 */ BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 12),  // TCP data offset, high nibble
      /* 1 */ BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 4),
      /* 2 */ BPF_STMT(BPF_ALU | BPF_LSH | BPF_K, 2),  // the TCP header's length in bytes
      /* 3 */ BPF_STMT(BPF_MISC | BPF_TAX, 0),         // X: where the payload starts
      /* 4 */ BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
      /* 5 */ BPF_STMT(BPF_ALU | BPF_SUB | BPF_X, 0),  // A: the payload's length
      // No payload (the handshake, an acknowledgement, the end): let it through.
      /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, to(kAccept, 6), 0),
      /* 7 */ BPF_STMT(BPF_ST, 1),  // M[1]: the payload's length
      /* 8 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, kHeader, 0, to(kDrop, 8)),
      /* 9 */ BPF_STMT(BPF_LD | BPF_W | BPF_IND, 4),  // length bytes 4..7
      /* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, to(kDrop, 10)),
      /* 11 */ BPF_STMT(BPF_LD | BPF_H | BPF_IND, 2),  // length bytes 2..3
      /* 12 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, to(kDrop, 12)),
      /* 13 */ BPF_STMT(BPF_LD | BPF_B | BPF_IND, 1),
      /* 14 */ BPF_STMT(BPF_ALU | BPF_LSH | BPF_K, 8),
      /* 15 */ BPF_STMT(BPF_ST, 2),
      /* 16 */ BPF_STMT(BPF_LD | BPF_B | BPF_IND, 0),
      /* 17 */ BPF_STMT(BPF_LDX | BPF_MEM, 2),
      /* 18 */ BPF_STMT(BPF_ALU | BPF_OR | BPF_X, 0),  // A: the length announced
      // More than UCX reads: it would recv() nothing for ever, at full CPU.
      /* 19 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, max_length, to(kDrop, 19), 0),
      /* 20 */ BPF_STMT(BPF_ALU | BPF_ADD | BPF_K, kHeader),
      /* 21 */ BPF_STMT(BPF_LDX | BPF_MEM, 1),
      // Exactly one whole message: the header and what it announces, nothing more or less.
      /* 22 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, to(kAccept, 22), to(kDrop, 22)),
      /* 23 */ BPF_STMT(BPF_RET | BPF_K, 0),           // drop
      /* 24 */ BPF_STMT(BPF_RET | BPF_K, 0xffffffff),  // keep all of it
  }};
}

}  // namespace

uint32_t sockcm_max_private_data() noexcept {
  const char* env = std::getenv("UCX_TCP_CM_PRIV_DATA_LEN");
  if (env == nullptr || *env == '\0') return kUcxDefaultPrivateData;
  // Read by UCX's own parser, as UCX reads it; "inf", "auto" or unreadable: the largest the
  // header check allows.
  size_t n = 0;
  if (ucs_str_to_memunits(env, &n) != UCS_OK || n == 0 || n > kGuardMaxPrivateData)
    return kGuardMaxPrivateData;
  return static_cast<uint32_t>(n) + kHeader;
}

bool guard_enabled() noexcept {
  const char* env = std::getenv("TENSORWIRE_UCX_LISTENER_GUARD");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

bool guard_sockcm_socket(int fd, uint32_t max_private_data) noexcept {
  std::array<sock_filter, kAccept + 1> p = program(max_private_data);
  sock_fprog prog{static_cast<unsigned short>(p.size()), p.data()};
  return ::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0;
}

}  // namespace tensorwire::ucx
