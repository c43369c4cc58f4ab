// Large contiguous copies (Tensor::clone / copy_ / consolidate) are split between the
// calling thread and a helper thread (src/core/copy_bytes.h): every byte lands where it
// belongs, whatever the size and alignment, from many threads at once, and in a child
// process forked after the helper started.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tensorwire/core/tensor.h"

namespace tw = tensorwire;

namespace {

tw::Tensor pattern(int64_t n, uint8_t seed) {
  tw::Tensor t = tw::Tensor::empty({n}, tw::DType::UInt8);
  auto* p = t.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + seed + (i >> 12));
  return t;
}

bool same_bytes(const tw::Tensor& a, const tw::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST(ParallelCopy, EveryByteArrivesForSizesAroundTheThresholdAndOddOffsets) {
  for (int64_t n : {int64_t{1} << 20, (int64_t{1} << 20) - 1, (int64_t{1} << 20) + 1,
                    (int64_t{3} << 20) + 17, int64_t{9} << 20}) {
    tw::Tensor src = pattern(n + 3, static_cast<uint8_t>(n));
    tw::Tensor view = tw::Tensor::view(src.storage(), 3, {n}, tw::DType::UInt8);  // unaligned
    tw::Tensor copy = view.clone();
    ASSERT_TRUE(same_bytes(copy, view)) << n;
  }
}

TEST(ParallelCopy, ManyThreadsCopyingAtOnceEachGetTheirOwnBytes) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &bad] {
      tw::Tensor src = pattern((int64_t{2} << 20) + t * 4096, static_cast<uint8_t>(t));
      for (int i = 0; i < 20; ++i)
        if (!same_bytes(src.clone(), src)) bad.fetch_add(1);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ParallelCopy, AChildForkedAfterTheHelperStartedCopiesToo) {
  tw::Tensor src = pattern(int64_t{4} << 20, 9);
  ASSERT_TRUE(same_bytes(src.clone(), src));  // the helper runs in this process now
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    bool ok = true;
    for (int i = 0; i < 5 && ok; ++i) ok = same_bytes(src.clone(), src);
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
