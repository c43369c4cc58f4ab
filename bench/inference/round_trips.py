"""One caller's round trips, timed one at a time: the loop the inference benchmarks share."""
import time


def round_trips(call, count, warmup=0):
    """Runs `call()` `warmup` times untimed, then `count` times timed; returns the samples in
    microseconds, sorted."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return samples
