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
    e->reported = false;
  }
  // Whether a connection `fd` of `socket` is listed (else its event is still unread).
  bool knows(int socket, int fd) { return find(socket, fd, false) != nullptr; }
  // The consumer was away from the sockets for `gap`: it does not count as silence.
  void pause(Clock::duration gap);
  struct Silent {
    ProducerInfo info;
    Clock::duration silence;  // since its last datapoint, pauses of the consumer left out
  };
  // The first producer that sent datapoints and then none for longer than `timeout`, not
  // reported since; marks it reported.
  std::optional<Silent> silent(Clock::time_point now, std::chrono::milliseconds timeout);
  std::vector<ProducerInfo> list() const;

 private:
  struct Entry {
    ProducerInfo info;
    int fd = -1;              // kept once closed: its last messages may still be queued
    Clock::time_point heard;  // the last datapoint, moved on by pauses of the consumer
    bool reported = false;
  };
  // The latest entry of this fd (the number is reused by later connections).
  Entry* find(int socket, int fd, bool only_connected);
  void forget_closed();
  std::deque<Entry> entries_;
};

}  // namespace tensorwire::dataflow
