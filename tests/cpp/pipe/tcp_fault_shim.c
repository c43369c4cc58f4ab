/* tcp_fault_shim: an LD_PRELOAD library that makes a process's first TCP connection look
 * like one to a peer that died just after the TCP handshake, for the test of a listener
 * whose client dies mid-wire-up (tests/python/test_pipe_runtime.py).
 *
 * With TW_FAULT_DEAD_PORT set, in the process it is loaded into:
 *  - the first connect() to an IPv4 address goes through (the handshake completes);
 *  - the first send() on that socket fails with ECONNRESET (the peer's reset);
 *  - the second connect() to an IPv4 address goes to 127.0.0.1:TW_FAULT_DEAD_PORT, where
 *    nothing listens, so the kernel refuses it (the peer's host has no such port any more).
 * Everything else passes through. A listening process makes no connect() of its own but
 * UCX's TCP data lanes (the connection manager only accepts), so the first is a lane's. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static atomic_int connects = 0;
/* The socket whose next send fails. Armed by its number: nothing closes it before that send
 * in the flow this injects into, so the number is not reused meanwhile. */
static atomic_int armed_fd = -1;

int connect(int fd, const struct sockaddr* addr, socklen_t len) {
  static int (*_Atomic real)(int, const struct sockaddr*, socklen_t) = NULL;
  if (real == NULL)
    real = (int (*)(int, const struct sockaddr*, socklen_t))dlsym(RTLD_NEXT, "connect");
  const char* dead_port = getenv("TW_FAULT_DEAD_PORT");
  if (dead_port == NULL || addr == NULL || addr->sa_family != AF_INET) return real(fd, addr, len);
  const int n = atomic_fetch_add(&connects, 1) + 1;
  if (n == 1) {
    atomic_store(&armed_fd, fd);
  } else if (n == 2) {
    struct sockaddr_in dead;
    memset(&dead, 0, sizeof dead);
    dead.sin_family = AF_INET;
    dead.sin_port = htons((unsigned short)atoi(dead_port));
    dead.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return real(fd, (const struct sockaddr*)&dead, sizeof dead);
  }
  return real(fd, addr, len);
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  static ssize_t (*_Atomic real)(int, const void*, size_t, int) = NULL;
  if (real == NULL) real = (ssize_t(*)(int, const void*, size_t, int))dlsym(RTLD_NEXT, "send");
  int expected = fd;
  if (fd >= 0 && atomic_compare_exchange_strong(&armed_fd, &expected, -1)) {
    errno = ECONNRESET;
    return -1;
  }
  return real(fd, buf, len, flags);
}
