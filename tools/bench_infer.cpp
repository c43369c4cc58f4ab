// `tensorwire bench infer`: the inference server's figures, all measured in one run.
//
//  1. latency: a bare shared-memory ping-pong between two processes (two WaitWords, the
//     transport's spin-then-futex strategy) against one client process's round trip
//     through SharedMemoryTransport + InferenceServer (float32[4] -> float32[2], a
//     policy that costs nothing); the ratio of the p50s.
//  2. throughput: N client processes, each calling in a loop, for every payload x
//     max_batch_size x client count: requests/s, average batch, client p50/p95.
//  3. memory (--memory N): segment sizes, and the RSS of the server and of each client
//     before and after N requests.
//  4. actors (--only actors): many actor processes (--actors, default 16,64,256) calling
//     in a loop, float32[4], max_batch_size 64, one run: requests/s, the ratio of the
//     largest count to the smallest, round-trip p50/p99 over every request of every actor;
//     then a server with the largest count of attached idle clients: its CPU use, and the
//     fds and memory each client costs the server and itself.
// Client processes are forked from this one and attach by name, like unrelated ones.
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "os/adaptive_spin.h"
#include "os/futex.h"
#include "os/process.h"
#include "tensorwire/core/json.h"
#include "tensorwire/inference/server.h"
#include "tensorwire/inference/shared_memory_transport.h"
#include "tensorwire/inference/socket_transport.h"
#include "tensorwire/inference/thread_transport.h"

namespace tensorwire::tools {

namespace {

using namespace inference;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> clients{1, 4};
  std::vector<std::string> payloads{"f32x4", "u8x84x84x3"};
  std::vector<int> batches{4, 64};
  double seconds = 2.0;
  uint32_t spin = SharedMemoryOptions{}.spin;
  uint32_t slots = 64;
  std::string transport = "shared_memory";
  int latency_requests = 20000;
  long memory_requests = 0;
  bool latency = true, throughput = true, actors = false;
  std::vector<int> actor_counts{16, 64, 256};
  double idle_seconds = 3.0;
  std::string json;
};

struct Payload {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
};

Payload parse_payload(const std::string& s) {
  Payload p{s, DType::Float32, {}};
  size_t x = s.find('x');
  std::string t = s.substr(0, x);
  if (t == "f32")
    p.dtype = DType::Float32;
  else if (t == "f64")
    p.dtype = DType::Float64;
  else if (t == "u8")
    p.dtype = DType::UInt8;
  else if (t == "i64")
    p.dtype = DType::Int64;
  else
    throw ValueError("payload '" + s + "': dtype must be f32, f64, u8 or i64 (e.g. u8x84x84x3)");
  while (x != std::string::npos) {
    size_t next = s.find('x', x + 1);
    p.shape.push_back(std::stoll(s.substr(x + 1, next - x - 1)));
    x = next;
  }
  return p;
}

std::string pretty_payload(const Payload& p) {
  std::string d(dtype_name(p.dtype));
  return d.substr(6) + shape_str(p.shape);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(static_cast<double>(v.size() - 1) * p + 0.5)];
}

long rss_kb() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Open fds of this process.
int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    --n;  // the directory's own
  }
  return n;
}

// Round trips in log-spaced buckets (16 per power of two, from 1 ns to ~68 s), so the
// percentiles of all actors together come from one merged histogram.
struct Histogram {
  static constexpr int kBuckets = 16 * 36;
  uint32_t counts[kBuckets] = {};
  void add(double us) {
    const double ns = std::max(us * 1000, 1.0);
    counts[std::min(static_cast<int>(16 * std::log2(ns)), kBuckets - 1)]++;
  }
  void merge(const Histogram& o) {
    for (int i = 0; i < kBuckets; ++i) counts[i] += o.counts[i];
  }
  double percentile_us(double p) const {
    uint64_t total = 0;
    for (uint32_t c : counts) total += c;
    if (total == 0) return 0;
    const auto rank = static_cast<uint64_t>(static_cast<double>(total - 1) * p);
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts[i];
      if (seen > rank) return std::exp2((i + 0.5) / 16) / 1000;  // the bucket's middle
    }
    return 0;
  }
};

// --- child processes, reporting over a pipe ---------------------------------------------

struct Report {
  uint64_t requests = 0;
  double seconds = 0;
  double p50_us = 0, p95_us = 0, p99_us = 0;
  long rss_start_kb = 0, rss_end_kb = 0;
  int fds_before = 0, fds_after = 0;  // before and after attaching (idle clients)
  int failed = 0;
  Histogram hist;
};

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;  // go signal out, report in
};

Child fork_child(const std::function<Report(int go_fd, int ready_fd)>& body) {
  int go[2], back[2];
  if (::pipe(go) != 0 || ::pipe(back) != 0) throw SystemError("pipe", errno);
  std::fflush(nullptr);
  pid_t pid = os::fork_tied();  // a bench stopped by SIGKILL leaves no client behind
  if (pid < 0) throw SystemError("fork", errno);
  if (pid == 0) {
    ::close(go[1]);
    ::close(back[0]);
    Report r;
    try {
      r = body(go[0], back[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench client: %s\n", e.what());
      r.failed = 1;
    }
    [[maybe_unused]] ssize_t n = ::write(back[1], &r, sizeof r);
    ::_exit(r.failed);
  }
  ::close(go[0]);
  ::close(back[1]);
  return {pid, go[1], back[0]};
}

void signal_ready(int fd) {
  char c = 'r';
  [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);
}
void wait_byte(int fd) {
  char c;
  if (::read(fd, &c, 1) != 1) throw Error("bench: a client process went away");
}

Report collect(Child& c) {
  Report r;
  size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = ::read(c.from, reinterpret_cast<char*>(&r) + got, sizeof r - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != sizeof r) r.failed = 1;
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  ::close(c.to);
  ::close(c.from);
  return r;
}

// --- transports and the do-nothing policy --------------------------------------------------

TensorDict request_spec(const Payload& p) {
  TensorDict td;
  td.set("observation", Tensor::zeros(p.shape, p.dtype));
  return td;
}
TensorDict response_spec() {
  TensorDict td;
  td.set("action", Tensor::zeros({2}, DType::Float32));
  return td;
}

// Returns a preallocated output per batch size: the policy costs (almost) nothing.
Policy noop_policy(size_t max_batch) {
  auto cache = std::make_shared<std::vector<TensorDict>>();
  for (size_t n = 0; n <= max_batch; ++n) {
    TensorDict out(Shape{static_cast<int64_t>(n)});
    out.set("action", Tensor::zeros({static_cast<int64_t>(n), 2}, DType::Float32));
    cache->push_back(std::move(out));
  }
  return [cache](const TensorDict& batch) {
    return (*cache)[static_cast<size_t>(batch.batch_size()[0])];
  };
}

std::shared_ptr<Transport> make_transport(const Options& o, const Payload& p, std::string& name) {
  if (o.transport == "socket") {
    auto t = SocketTransport::create();
    name = t->name();
    return t;
  }
  SharedMemoryOptions so;
  so.num_slots = o.slots;
  so.spin = o.spin;
  auto t = SharedMemoryTransport::create(request_spec(p), response_spec(), so);
  name = t->name();
  return t;
}

Client client_for(const Options& o, const std::string& name) {
  return o.transport == "socket" ? SocketTransport::client_for(name)
                                 : SharedMemoryTransport::client_for(name);
}

// --- 1. latency -------------------------------------------------------------------------

// The latency figures interleave blocks of bare ping-pongs with blocks of round trips,
// so both see the same load on the machine (figures on a shared machine drift by
// integer factors from one second to the next).
struct LatencyShared {
  os::WaitWord ping;
  alignas(64) os::WaitWord pong;
  alignas(64) os::WaitWord go;
  alignas(64) os::WaitWord done;
  alignas(64) std::atomic<uint32_t> stop{0};
  double rt[1];  // round-trip samples, written by the client process
};

Json run_latency(const Options& o) {
  const Payload p = parse_payload("f32x4");
  std::printf(
      "== latency: one client process, float32[4] -> float32[2], a policy that costs nothing ==\n");
  std::printf(
      "   wait strategy: spin up to %u pause iterations (%.0f ns each, adaptive), then futex\n\n",
      o.spin, os::AdaptiveSpin::pause_ns());
  const int block = 500;
  const int blocks = std::max(1, o.latency_requests / block);
  const int n = blocks * block;
  const size_t bytes = sizeof(LatencyShared) + sizeof(double) * static_cast<size_t>(n);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw SystemError("mmap", errno);
  auto* L = new (mem) LatencyShared;
  const auto forever = Clock::time_point::max();
  auto always = [] { return true; };

  std::string name;
  auto t = make_transport(o, p, name);
  InferenceServer server(noop_policy(64), t, {.max_batch_size = 64});
  server.start();

  std::fflush(nullptr);
  pid_t partner = os::fork_tied();  // it waits for ever otherwise
  if (partner == 0) {               // the other end of the ping-pong
    os::AdaptiveSpin spin(o.spin);
    uint32_t seen = 0;
    while (true) {
      seen = spin.wait(L->ping, seen, forever, always);
      if (L->stop.load()) ::_exit(0);
      L->pong.notify_all();
    }
  }
  Child c = fork_child([&](int, int ready) {
    Client client = client_for(o, name);
    TensorDict req = request_spec(p);
    for (int i = 0; i < 2000; ++i) client(req);
    signal_ready(ready);
    uint32_t seen = 0;
    for (int b = 0;; ++b) {
      seen = L->go.wait(seen, forever, always, {0});
      if (L->stop.load()) return Report{};
      for (int i = 0; i < block; ++i) {
        auto t0 = Clock::now();
        client(req);
        L->rt[b * block + i] = us_between(t0, Clock::now());
      }
      L->done.notify_all();
    }
  });
  wait_byte(c.from);

  std::vector<double> pp;
  pp.reserve(static_cast<size_t>(n));
  os::AdaptiveSpin spin(o.spin);
  uint32_t pong_seen = 0, done_seen = 0;
  for (int i = 0; i < 1000; ++i) {  // warm-up
    L->ping.notify_all();
    pong_seen = spin.wait(L->pong, pong_seen, forever, always);
  }
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < block; ++i) {
      auto t0 = Clock::now();
      L->ping.notify_all();
      pong_seen = spin.wait(L->pong, pong_seen, forever, always);
      pp.push_back(us_between(t0, Clock::now()));
    }
    L->go.notify_all();
    done_seen = L->done.wait(done_seen, forever, always, {0});
  }
  L->stop = 1;
  L->ping.notify_all();
  L->go.notify_all();
  ::waitpid(partner, nullptr, 0);
  collect(c);
  server.shutdown();
  std::vector<double> rt(L->rt, L->rt + n);
  ::munmap(mem, bytes);

  const double pp50 = percentile(pp, 0.5), pp95 = percentile(pp, 0.95), pp99 = percentile(pp, 0.99);
  const double rt50 = percentile(rt, 0.5), rt95 = percentile(rt, 0.95), rt99 = percentile(rt, 0.99);
  std::printf("   %-36s %9s %9s %9s\n", "", "p50 us", "p95 us", "p99 us");
  std::printf("   %-36s %9.2f %9.2f %9.2f\n", "bare shm ping-pong (2 processes)", pp50, pp95, pp99);
  std::printf("   %-36s %9.2f %9.2f %9.2f\n", ("round trip, " + o.transport + " transport").c_str(),
              rt50, rt95, rt99);
  const double ratio = rt50 / pp50;
  std::printf(
      "   ratio of p50s: %.2fx (target <= 3x: %s); %d samples each, in %d interleaved blocks\n\n",
      ratio, ratio <= 3 ? "met" : "MISSED", n, blocks);
  return {{"spin", o.spin},
          {"pause_ns", os::AdaptiveSpin::pause_ns()},
          {"samples", n},
          {"pingpong_us", {{"p50", pp50}, {"p95", pp95}, {"p99", pp99}}},
          {"round_trip_us", {{"p50", rt50}, {"p95", rt95}, {"p99", rt99}}},
          {"ratio_p50", ratio}};
}

// --- 2. throughput -------------------------------------------------------------------------

struct RunResult {
  double requests_per_s = 0, avg_batch = 0, p50_us = 0, p95_us = 0;
  double all_p50_us = 0, all_p99_us = 0;  // over every request of every client
  long server_rss_start_kb = 0, server_rss_end_kb = 0;
  std::vector<Report> clients;
};

// `clients` processes call in a loop for `seconds` (or, with total > 0, `total` requests
// between them).
RunResult run_clients(const Options& o, const Payload& p, int batch, int clients, long total) {
  std::string name;
  auto t = make_transport(o, p, name);
  InferenceServer server(noop_policy(static_cast<size_t>(batch)), t, {.max_batch_size = batch});
  server.start();
  std::vector<Child> kids;
  const double seconds = o.seconds;
  const long each = total > 0 ? total / clients : 0;
  for (int k = 0; k < clients; ++k) {
    kids.push_back(fork_child([&](int go, int ready) {
      Client client = client_for(o, name);
      TensorDict req = request_spec(p);
      for (int i = 0; i < 500; ++i) client(req);
      Report r;
      r.rss_start_kb = rss_kb();
      signal_ready(ready);
      wait_byte(go);
      std::vector<double> lat;
      if (each == 0) lat.reserve(1 << 20);  // no samples in a memory run: RSS is the figure
      const auto start = Clock::now();
      const auto stop = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(seconds));
      for (uint64_t i = 0;; ++i) {
        if (each > 0 ? static_cast<long>(i) >= each : (i % 16 == 0 && Clock::now() >= stop)) break;
        auto t0 = Clock::now();
        client(req);
        const double us = us_between(t0, Clock::now());
        if (lat.size() < lat.capacity()) lat.push_back(us);
        if (each == 0) r.hist.add(us);
        ++r.requests;
      }
      r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      r.p50_us = percentile(lat, 0.5);
      r.p95_us = percentile(lat, 0.95);
      r.rss_end_kb = rss_kb();
      return r;
    }));
  }
  for (Child& c : kids) wait_byte(c.from);
  RunResult res;
  res.server_rss_start_kb = rss_kb();
  server.stats(/*reset=*/true);
  for (Child& c : kids) signal_ready(c.to);
  double slowest = 0;
  uint64_t requests = 0;
  std::vector<double> p50s, p95s;
  Histogram all;
  for (Child& c : kids) {
    Report r = collect(c);
    all.merge(r.hist);
    if (r.failed) throw Error("bench: a client process failed");
    requests += r.requests;
    slowest = std::max(slowest, r.seconds);
    p50s.push_back(r.p50_us);
    p95s.push_back(r.p95_us);
    res.clients.push_back(r);
  }
  ServerStats st = server.stats();
  res.server_rss_end_kb = rss_kb();
  server.shutdown();
  res.requests_per_s = static_cast<double>(requests) / slowest;
  res.avg_batch = st.avg_batch_size;
  res.p50_us = percentile(p50s, 0.5);
  res.p95_us = *std::max_element(p95s.begin(), p95s.end());
  res.all_p50_us = all.percentile_us(0.5);
  res.all_p99_us = all.percentile_us(0.99);
  return res;
}

Json run_throughput(const Options& o) {
  std::printf(
      "== throughput: client processes calling in a loop for %.1f s each, a policy that costs "
      "nothing ==\n",
      o.seconds);
  std::printf("   transport %s, %u slots\n\n", o.transport.c_str(), o.slots);
  std::printf("   %-18s %9s %7s %12s %10s %12s %12s\n", "payload", "max_batch", "clients",
              "requests/s", "avg batch", "p50 us", "p95 us");
  Json rows = Json::array();
  for (const std::string& ps : o.payloads) {
    const Payload p = parse_payload(ps);
    for (int batch : o.batches)
      for (int clients : o.clients) {
        RunResult r = run_clients(o, p, batch, clients, 0);
        std::printf("   %-18s %9d %7d %12.0f %10.2f %12.2f %12.2f\n", pretty_payload(p).c_str(),
                    batch, clients, r.requests_per_s, r.avg_batch, r.p50_us, r.p95_us);
        std::fflush(stdout);
        rows.push_back({{"payload", pretty_payload(p)},
                        {"max_batch_size", batch},
                        {"clients", clients},
                        {"requests_per_s", r.requests_per_s},
                        {"avg_batch", r.avg_batch},
                        {"p50_us", r.p50_us},
                        {"p95_us", r.p95_us}});
      }
  }
  std::printf("\n");
  return rows;
}

// --- 3. memory ------------------------------------------------------------------------

Json run_memory(const Options& o) {
  std::printf("== memory ==\n");
  SharedMemoryOptions so;
  so.num_slots = 64;
  auto t =
      SharedMemoryTransport::create(request_spec(parse_payload("u8x84x84x3")), response_spec(), so);
  auto s = t->sizes();
  std::printf(
      "   segments for num_slots=64, uint8[84, 84, 3] -> float32[2]: control %zu B, "
      "requests %zu B, responses %zu B, total %zu B (%.2f MiB)\n",
      s.control, s.requests, s.responses, s.total(), static_cast<double>(s.total()) / (1 << 20));
  t.reset();
  Json out = {{"segments_num_slots_64_u8x84x84x3",
               {{"control", s.control},
                {"requests", s.requests},
                {"responses", s.responses},
                {"total", s.total()}}}};
  if (o.memory_requests <= 0) {
    std::printf("   (RSS over many requests: run with --memory N)\n\n");
    return out;
  }
  const int clients = 4;
  RunResult r = run_clients(o, parse_payload("f32x4"), 64, clients, o.memory_requests);
  std::printf("   %ld requests from %d client processes: server RSS %ld -> %ld KiB (%+ld)\n",
              o.memory_requests, clients, r.server_rss_start_kb, r.server_rss_end_kb,
              r.server_rss_end_kb - r.server_rss_start_kb);
  Json cl = Json::array();
  for (size_t k = 0; k < r.clients.size(); ++k) {
    const Report& c = r.clients[k];
    std::printf("   client %zu: %lu requests, RSS %ld -> %ld KiB (%+ld)\n", k,
                static_cast<unsigned long>(c.requests), c.rss_start_kb, c.rss_end_kb,
                c.rss_end_kb - c.rss_start_kb);
    cl.push_back(
        {{"requests", c.requests}, {"rss_start_kb", c.rss_start_kb}, {"rss_end_kb", c.rss_end_kb}});
  }
  std::printf("\n");
  out["rss"] = {{"requests", o.memory_requests},
                {"server_rss_start_kb", r.server_rss_start_kb},
                {"server_rss_end_kb", r.server_rss_end_kb},
                {"clients", cl}};
  return out;
}

// --- 4. actors ---------------------------------------------------------------------------

// A server with `clients` attached idle client processes (each made one request, so it is
// attached and has used a slot): the server process's CPU use over idle_seconds, and what
// each client costs in fds (in the server and in itself) and memory.
Json run_idle(const Options& o, int clients) {
  const Payload p = parse_payload("f32x4");
  std::string name;
  auto t = make_transport(o, p, name);
  InferenceServer server(noop_policy(64), t, {.max_batch_size = 64});
  server.start();
  const int server_fds_before = open_fds();
  std::vector<Child> kids;
  for (int k = 0; k < clients; ++k) {
    kids.push_back(fork_child([&](int go, int ready) {
      Report r;
      r.fds_before = open_fds();
      r.rss_start_kb = rss_kb();
      Client client = client_for(o, name);
      TensorDict req = request_spec(p);
      client(req);
      r.fds_after = open_fds();
      r.rss_end_kb = rss_kb();
      signal_ready(ready);
      wait_byte(go);  // idle, attached, until told to go
      return r;
    }));
  }
  for (Child& c : kids) wait_byte(c.from);
  // Let the server's waits settle into their idle state first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The pipes to the children are the bench's, not the server's.
  const int server_fds = open_fds() - server_fds_before - 2 * clients;
  timespec c0{}, c1{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
  const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) +
                     static_cast<double>(c1.tv_nsec - c0.tv_nsec) / 1e9;
  std::vector<Report> reports;
  for (Child& c : kids) signal_ready(c.to);
  for (Child& c : kids) reports.push_back(collect(c));
  const auto sizes = std::static_pointer_cast<SharedMemoryTransport>(t)->sizes();
  server.shutdown();
  std::vector<double> client_fds, client_rss;
  for (const Report& r : reports) {
    if (r.failed) throw Error("bench: an idle client process failed");
    client_fds.push_back(r.fds_after - r.fds_before);
    client_rss.push_back(static_cast<double>(r.rss_end_kb - r.rss_start_kb));
  }
  const double pct = 100 * cpu / wall;
  std::printf(
      "   server with %d attached idle clients: %.3f%% of a core over %.1f s (target < 2%%: %s)\n",
      clients, pct, wall, pct < 2 ? "met" : "MISSED");
  std::printf(
      "   per client: %.2f fds in the server, %.0f fds in the client (median), client RSS +%.0f KiB"
      " (median) on attaching and one request\n",
      static_cast<double>(server_fds) / clients, percentile(client_fds, 0.5),
      percentile(client_rss, 0.5));
  std::printf(
      "   shared memory: one set of segments for all clients (control %zu B, requests %zu B, "
      "responses %zu B; %u slots), mapped by each: 0 B more per client\n\n",
      sizes.control, sizes.requests, sizes.responses, o.slots);
  return {
      {"clients", clients},
      {"server_cpu_percent_of_core", pct},
      {"server_fds_per_client", static_cast<double>(server_fds) / clients},
      {"client_fds", percentile(client_fds, 0.5)},
      {"client_rss_kb", percentile(client_rss, 0.5)},
      {"segments",
       {{"control", sizes.control}, {"requests", sizes.requests}, {"responses", sizes.responses}}}};
}

Json run_actors(const Options& o) {
  const Payload p = parse_payload("f32x4");
  std::printf(
      "== actors: N actor processes calling in a loop for %.1f s, float32[4], max_batch_size 64, "
      "a policy that costs nothing ==\n",
      o.seconds);
  std::printf("   transport %s, %u slots\n\n", o.transport.c_str(), o.slots);
  std::printf("   %7s %12s %10s %12s %12s\n", "actors", "requests/s", "avg batch", "p50 us",
              "p99 us");
  Json rows = Json::array();
  std::vector<double> rates;
  for (int n : o.actor_counts) {
    RunResult r = run_clients(o, p, 64, n, 0);
    rates.push_back(r.requests_per_s);
    std::printf("   %7d %12.0f %10.2f %12.2f %12.2f\n", n, r.requests_per_s, r.avg_batch,
                r.all_p50_us, r.all_p99_us);
    std::fflush(stdout);
    rows.push_back({{"actors", n},
                    {"requests_per_s", r.requests_per_s},
                    {"avg_batch", r.avg_batch},
                    {"p50_us", r.all_p50_us},
                    {"p99_us", r.all_p99_us}});
  }
  const double ratio = rates.back() / rates.front();
  std::printf("   requests/s at %d actors / at %d: %.0f%% (target >= 70%%: %s)\n\n",
              o.actor_counts.back(), o.actor_counts.front(), 100 * ratio,
              ratio >= 0.7 ? "met" : "MISSED");
  Json out = {{"rows", rows}, {"ratio_last_first", ratio}};
  if (o.transport == "shared_memory")
    out["idle"] = run_idle(o, *std::max_element(o.actor_counts.begin(), o.actor_counts.end()));
  return out;
}

}  // namespace

int bench_infer(int argc, char** argv) {
  // A client process that failed has closed its pipe: its report says so, not a SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  Options o;
  std::string only;
  CLI::App app("Inference server figures: latency, throughput, memory.", "tensorwire bench infer");
  app.add_option("--clients", o.clients, "client process counts, ','-separated (default 1,4)")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--payloads", o.payloads,
                 "observation payloads, dtype x dims (default f32x4,u8x84x84x3)")
      ->delimiter(',');
  app.add_option("--batches", o.batches, "max_batch_size values (default 4,64)")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--seconds", o.seconds, "duration of each throughput run (default 2)")
      ->check(kPositive);
  app.add_option("--transport", o.transport, "shared_memory (default) or socket")
      ->check(CLI::IsMember({"shared_memory", "socket"}));
  app.add_option("--slots", o.slots, "slots of the shared-memory transport (default 64)")
      ->check(kPositive);
  app.add_option("--spin", o.spin, "pause iterations before a futex sleep")->check(kNonNegative);
  app.add_option("--latency-requests", o.latency_requests,
                 "round trips for the latency figures, in whole blocks of 500 (at least one; "
                 "default 20000)")
      ->check(kPositive);
  app.add_option("--memory", o.memory_requests, "also run N requests and report RSS")
      ->check(kPositive);
  app.add_option("--actors", o.actor_counts,
                 "actor process counts of --only actors, ','-separated (default 16,64,256)")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--idle-seconds", o.idle_seconds,
                 "how long --only actors measures the idle server's CPU use (default 3)")
      ->check(kPositive);
  app.add_option("--only", only, "run one part only (actors: only with --only)")
      ->check(CLI::IsMember({"latency", "throughput", "memory", "actors"}));
  app.add_option("--json", o.json, "also write the figures as JSON");
  if (int status = parse(app, argc, argv); status >= 0) return status;
  const bool only_memory = only == "memory";
  if (!only.empty()) {
    o.latency = only == "latency";
    o.throughput = only == "throughput";
    o.actors = only == "actors";
  }
  for (const std::string& p : o.payloads) parse_payload(p);  // fail early on a typo
  Json out = {{"transport", o.transport}};
  if (o.latency) out["latency"] = run_latency(o);
  if (o.throughput) out["throughput"] = run_throughput(o);
  if (o.actors) out["actors"] = run_actors(o);
  if (only_memory || (o.latency && o.throughput) || o.memory_requests > 0)
    out["memory"] = run_memory(o);
  if (!o.json.empty()) {
    write_json(o.json, out.dump(2), "bench infer");
    std::printf("figures written to %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace tensorwire::tools
