// ProducerTable: the producers of a RemoteDataZMQ, told apart by the connection (fd) each
// message came in on, and kept from the sockets' connection events (zmqio::Monitor). It
// decides when a producer that was sending has been silent for too long.
#pragma once

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/dataflow/remote.h"

namespace tensorwire::dataflow {

class ProducerTable {
 public:
  using Clock = std::chrono::steady_clock;

  void connected(int socket, int fd, std::string address);
  void disconnected(int socket, int fd);
  // A datapoint from the connection `fd` of `socket` (a connection not seen yet, or not
  // named yet, is named by `address_of()`). Read the connection events first: a message comes after
  // the event of its connection.
  template <class AddressOf>
  void datapoint(int socket, int fd, Clock::time_point now, AddressOf address_of) {
    Entry* e = find(socket, fd, false);
    if (e == nullptr) {
      connected(socket, fd, address_of());
      e = find(socket, fd, false);
    } else if (e->info.address.empty()) {
      e->info.address = address_of();  // it closed before its event was read
    }
    ++e->info.datapoints;
    e->info.last_datapoint = now;
    e->heard = now;
    e->read_at_heard = ++read_;
    e->reported = false;
  }
  // Whether a connection `fd` of `socket` is listed (else its event is still unread).
  bool knows(int socket, int fd) { return find(socket, fd, false) != nullptr; }
  // The consumer was away from the sockets for `gap`: it does not count as silence, unless
  // the consumer read enough from the others meanwhile (silent()).
  void pause(Clock::duration gap);
  struct Silent {
    ProducerInfo info;
    Clock::duration silence;  // since its last datapoint, pauses of the consumer left out
  };
  // The first producer that sent datapoints and then none for longer than `timeout`, not
  // reported since; marks it reported. Silence is counted two ways, and either reports:
  // - time, the consumer's pauses left out (its producers were waiting for it);
  // - time with the pauses, once the consumer read more datapoints from the others than
  //   could be ahead of this one's in the fair queue. A consumer that always reads slower
  //   than a quarter of the bound pauses before every read, and by time alone a producer
  //   whose host vanished would never be reported; one alive and waiting for the consumer
  //   has its next datapoint queued, and is read within a round of the others.
  // Marks it reported.
  std::optional<Silent> silent(Clock::time_point now, std::chrono::milliseconds timeout);
  std::vector<ProducerInfo> list() const;

 private:
  struct Entry {
    ProducerInfo info;
    int fd = -1;                 // kept once closed: its last messages may still be queued
    Clock::time_point heard;     // the last datapoint, moved on by pauses of the consumer
    uint64_t read_at_heard = 0;  // read_ at its last datapoint
    bool reported = false;
  };
  uint64_t read_ = 0;  // datapoints read, from all producers
  // The latest entry of this fd (the number is reused by later connections).
  Entry* find(int socket, int fd, bool only_connected);
  void forget_closed();
  std::deque<Entry> entries_;
};

}  // namespace tensorwire::dataflow
