#include "multi_transport.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "policy_output.h"
#include "tensorwire/core/error.h"

namespace tensorwire::inference::detail {

namespace {

// The wait of one transport at a time while several are served.
constexpr auto kSlice = std::chrono::microseconds(500);

// Keeping shares (min_share > 0). What a part was given fades by this much with each drain
// that took anything: its share is that of the last hundred or so drains.
constexpr double kFade = 0.98;
// A part is asking while its last request came within this many of its usual intervals
// (and within a second): actors that stopped are not waited for beyond that.
constexpr int kAskingGaps = 16;
constexpr auto kLongestAsking = std::chrono::seconds(1);
// A batch waits for a part below its share at most this many of its usual intervals.
constexpr int kWaitGaps = 4;
// A part is waited for while below its share times this (at most an equal share): what it
// gets hovers around where the waits begin, a little under it as often as over.
constexpr double kAimAbove = 1.25;
// The shortest interval counted (a part whose requests came together has one of 0).
constexpr auto kShortestGap = std::chrono::microseconds(20);

// Whether two policy inputs can be concatenated along dim 0: same keys in the same order,
// same dtypes and trailing shapes, same trailing batch dims.
bool same_structure(const TensorDict& a, const TensorDict& b) {
  if (a.items().size() != b.items().size() || a.batch_dims() != b.batch_dims()) return false;
  if (!std::equal(a.batch_size().begin() + 1, a.batch_size().end(), b.batch_size().begin() + 1))
    return false;
  for (size_t i = 0; i < a.items().size(); ++i) {
    const auto& [na, ea] = a.items()[i];
    const auto& [nb, eb] = b.items()[i];
    if (na != nb || ea.is_tensor() != eb.is_tensor()) return false;
    if (ea.is_tensor()) {
      const Tensor &ta = ea.tensor(), &tb = eb.tensor();
      if (ta.dtype() != tb.dtype() || ta.shape().size() != tb.shape().size() ||
          !std::equal(ta.shape().begin() + 1, ta.shape().end(), tb.shape().begin() + 1))
        return false;
    } else if (ea.is_tensordict()) {
      if (!eb.is_tensordict() || !same_structure(ea.tensordict(), eb.tensordict())) return false;
    } else {
      return false;  // non-tensor values: transports without a fixed layout group alone
    }
  }
  return true;
}

// `parts` (of one structure) one after the other along dim 0, in fresh memory.
TensorDict concat(const std::vector<const TensorDict*>& parts, int64_t total) {
  const TensorDict& first = *parts[0];
  Shape batch = first.batch_size();
  batch[0] = total;
  TensorDict out(batch, first.device());
  for (size_t i = 0; i < first.items().size(); ++i) {
    const auto& [name, e] = first.items()[i];
    if (e.is_tensor()) {
      Shape shape = e.tensor().shape();
      shape[0] = total;
      Tensor t = Tensor::empty(shape, e.tensor().dtype());
      auto* dst = static_cast<std::byte*>(t.data());
      for (const TensorDict* p : parts) {
        const Tensor& src = p->items()[i].second.tensor();
        src.copy_to(dst);
        dst += src.nbytes();
      }
      out.set(name, t);
    } else {
      std::vector<const TensorDict*> sub;
      for (const TensorDict* p : parts) sub.push_back(&p->items()[i].second.tensordict());
      out.set(name, concat(sub, total));
    }
  }
  return out;
}

}  // namespace

MultiTransport::MultiTransport(std::vector<std::shared_ptr<Transport>> parts, double min_share,
                               std::chrono::nanoseconds max_wait)
    : parts_(std::move(parts)), min_share_(min_share), max_wait_(max_wait) {
  if (parts_.empty()) throw ValueError("InferenceServer: no transport given");
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (!parts_[i])
      throw ValueError("InferenceServer: transport " + std::to_string(i) + " is null");
    for (size_t j = 0; j < i; ++j)
      if (parts_[j] == parts_[i])
        throw ValueError("InferenceServer: transport " + std::to_string(i) +
                         " is given twice (also at " + std::to_string(j) + ")");
  }
  sub_.resize(parts_.size());
  part_groups_.resize(parts_.size());
  pace_.resize(parts_.size());
}

Client MultiTransport::client() {
  return parts_[0]->client();
}

void MultiTransport::open_server() {
  size_t opened = 0;
  try {
    for (; opened < parts_.size(); ++opened) {
      if (parts_[opened]->closed())
        throw ClosedError(std::string("cannot start an InferenceServer on a closed ") +
                          parts_[opened]->kind() + " transport");
      parts_[opened]->open_server();
    }
  } catch (...) {
    // Each part opened is as it was: its claim given up, its requests kept (a close_server
    // failed them and left the part refusing submits, though no server ever ran).
    for (size_t i = 0; i < opened; ++i) parts_[i]->release_server();
    throw;
  }
  // The server sleeps on the parts that cannot tell it of their work (or on the first, when
  // every part can); each of the others wakes them when it has a request.
  sleep_on_.clear();
  for (auto& p : parts_)
    if (!p->notify_work(nullptr)) sleep_on_.push_back(p);
  if (sleep_on_.empty()) sleep_on_.push_back(parts_[0]);
  std::vector<std::weak_ptr<Transport>> wake;  // weak: a hook left behind keeps nothing alive
  for (auto& s : sleep_on_) wake.emplace_back(s);
  for (auto& p : parts_)
    p->notify_work([wake] {
      for (const auto& w : wake)
        if (auto s = w.lock()) s->interrupt();
    });
}

void MultiTransport::release_server() noexcept {
  for (auto& p : parts_) p->release_server();
}

void MultiTransport::close_server(const std::string& reason, bool fail_pending) {
  for (auto& p : parts_) {
    p->notify_work(nullptr);
    p->close_server(reason, fail_pending);
  }
}

void MultiTransport::wait_for_work(Deadline deadline) {
  // Sleeping on an idle part while another has work would hold that work for a slice.
  for (auto& p : parts_)
    if (p->has_work()) return;
  const Deadline slice = deadline.min(Deadline::after(kSlice));
  if (sleep_on_.empty()) return parts_[0]->wait_for_work(slice);  // before open_server()
  sleep_on_[turn_++ % sleep_on_.size()]->wait_for_work(slice);
}

void MultiTransport::interrupt() {
  interrupts_.fetch_add(1, std::memory_order_acq_rel);  // ends a share's wait (drain())
  for (auto& p : parts_) p->interrupt();
}

bool MultiTransport::has_work() {
  for (auto& p : parts_)
    if (p->has_work()) return true;
  return false;
}

bool MultiTransport::notify_work(std::function<void()>) {
  return false;  // not nested in another MultiTransport: InferenceServer sleeps on it itself
}

void MultiTransport::drain(size_t max_items, Drained& out) {
  if (out.empty()) {
    for (Drained& s : sub_) s.clear();
    where_.clear();
    answered_.clear();
  }
  // `max_items` more, on top of what `out` holds already (a batch that waits for
  // min_batch_size drains again).
  const size_t cap = out.size() + max_items;
  const size_t n = parts_.size();
  const size_t start = next_++ % n;
  got_.assign(n, 0);
  auto take = [&](size_t i, size_t limit) {
    Drained& s = sub_[i];
    const size_t before = s.size();
    parts_[i]->drain(limit, s);
    for (size_t k = before; k < s.size(); ++k) {
      out.ids.push_back(where_.size());
      out.submitted_ns.push_back(s.submitted_ns[k]);
      where_.push_back({i, k});
    }
    got_[i] += s.size() - before;
  };
  // A fair share each first, then what is left to whoever has more.
  const size_t share = std::max<size_t>(1, max_items / n);
  for (size_t j = 0; j < n && out.size() < cap; ++j)
    take((start + j) % n, std::min(share, cap - out.size()));
  for (size_t j = 0; j < n && out.size() < cap; ++j) take((start + j) % n, cap - out.size());
  if (min_share_ <= 0) return;
  if (out.size() < cap) {
    if (const std::optional<size_t> p = lagging(Clock::now())) {
      // Its actors call in a loop and their next requests are on their way: the batch waits
      // for them, and what comes from the others meanwhile waits for the next batch (which
      // is what moves the shares). Taken, not only waited for: a remote transport's serving
      // thread takes in requests that its connections have not handed over yet
      // (RemoteTransport::drain). Over at interrupt() (a shutdown) or when it closes.
      const Deadline until = Deadline::after(std::min(
          max_wait_, kWaitGaps * std::max<std::chrono::nanoseconds>(pace_[*p].gap, kShortestGap)));
      const uint64_t seen = interrupts_.load(std::memory_order_acquire);
      while (got_[*p] == 0 && !until.passed() && !parts_[*p]->closed() &&
             interrupts_.load(std::memory_order_acquire) == seen) {
        parts_[*p]->wait_for_work(until.min(Deadline::after(kSlice)));
        take(*p, std::min(share, cap - out.size()));
      }
    }
  }
  account(Clock::now());
}

std::optional<size_t> MultiTransport::lagging(Clock::time_point now) const {
  auto asking = [&](const Pace& p) {
    const auto window = std::min<std::chrono::nanoseconds>(
        kLongestAsking, kAskingGaps * std::max<std::chrono::nanoseconds>(p.gap, kShortestGap));
    return p.last && now - *p.last < window;
  };
  double total = 0;
  size_t active = 0;
  for (const Pace& p : pace_) {
    total += p.recent;
    active += asking(p) ? 1 : 0;
  }
  if (active < 2 || total <= 0) return std::nullopt;
  const double equal = 1.0 / static_cast<double>(active);
  const double floor = std::min(min_share_ * kAimAbove, equal) * total;
  // The one furthest below its share, when several are.
  std::optional<size_t> behind;
  for (size_t i = 0; i < pace_.size(); ++i)
    if (got_[i] == 0 && asking(pace_[i]) && pace_[i].recent < floor &&
        (!behind || pace_[i].recent < pace_[*behind].recent))
      behind = i;
  return behind;
}

void MultiTransport::account(Clock::time_point now) {
  if (std::all_of(got_.begin(), got_.end(), [](size_t g) { return g == 0; })) return;
  for (size_t i = 0; i < pace_.size(); ++i) {
    Pace& p = pace_[i];
    p.recent = p.recent * kFade + static_cast<double>(got_[i]);
    if (got_[i] == 0) continue;
    if (p.last) {
      const auto interval = std::max<std::chrono::nanoseconds>(now - *p.last, kShortestGap);
      p.gap = p.gap.count() == 0 ? interval : (7 * p.gap + interval) / 8;
    }
    p.last = now;
  }
}

void MultiTransport::collate(const Drained& drained, std::vector<Group>& groups) {
  std::vector<std::vector<size_t>> back(parts_.size());  // sub position -> server position
  for (size_t i = 0; i < parts_.size(); ++i) back[i].assign(sub_[i].size(), 0);
  for (size_t k = 0; k < drained.size(); ++k)
    back[where_[drained.ids[k]].part][where_[drained.ids[k]].pos] = k;
  groups.clear();
  pieces_.clear();
  std::vector<std::vector<const TensorDict*>> inputs;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (sub_[i].empty()) continue;
    parts_[i]->collate(sub_[i], part_groups_[i]);
    for (size_t g = 0; g < part_groups_[i].size(); ++g) {
      const Group& pg = part_groups_[i][g];
      size_t m = 0;
      while (m < groups.size() && !same_structure(*inputs[m][0], *pg.input)) ++m;
      if (m == groups.size()) {
        groups.emplace_back();
        pieces_.emplace_back();
        inputs.emplace_back();
      }
      const auto n = static_cast<int64_t>(pg.rows.size());
      pieces_[m].push_back({i, g, static_cast<int64_t>(groups[m].rows.size()), n});
      inputs[m].push_back(pg.input.get());
      for (size_t row : pg.rows) groups[m].rows.push_back(back[i][row]);
    }
  }
  for (size_t m = 0; m < groups.size(); ++m) {
    if (inputs[m].size() == 1)
      groups[m].input = part_groups_[pieces_[m][0].part][pieces_[m][0].group].input;
    else
      groups[m].input = std::make_shared<const TensorDict>(
          concat(inputs[m], static_cast<int64_t>(groups[m].rows.size())));
  }
  answered_.assign(drained.size(), false);
  groups_ = groups.data();
}

void MultiTransport::resolve(const Drained& drained, const Group& group, const TensorDict& output,
                             const VersionStamp& stamp) {
  const auto m = static_cast<size_t>(&group - groups_);
  const auto n = static_cast<int64_t>(group.rows.size());
  check_output_rows(output, n);
  for (const Piece& p : pieces_[m]) {
    const Group& pg = part_groups_[p.part][p.group];
    parts_[p.part]->resolve(
        sub_[p.part], pg, pieces_[m].size() == 1 ? output : output.slice(p.offset, p.n, 1), stamp);
    for (int64_t r = 0; r < p.n; ++r)
      answered_[group.rows[static_cast<size_t>(p.offset + r)]] = true;
  }
  (void)drained;
}

void MultiTransport::reject(const Drained& drained, std::span<const size_t> rows,
                            const RemoteError& error) {
  std::vector<std::vector<size_t>> by_part(parts_.size());
  for (size_t row : rows) {
    if (row < answered_.size() && answered_[row]) continue;  // answered before a later part failed
    const Where& w = where_[drained.ids[row]];
    by_part[w.part].push_back(w.pos);
  }
  for (size_t i = 0; i < parts_.size(); ++i)
    if (!by_part[i].empty()) parts_[i]->reject(sub_[i], by_part[i], error);
}

}  // namespace tensorwire::inference::detail
