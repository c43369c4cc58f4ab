"""How long TensorDictPipe.connect takes to a PipeListener of this host: --connects connects
in a row, each accepted by a thread of this process and closed at once; the median and the
90th percentile of the client's connect() call, in milliseconds.

UCX reads its settings once per process, so compare settings with one process each, e.g.
the non-blocking TCP connects tensorwire sets against UCX's blocking default:

    UCX_TLS=tcp UCX_TCP_CONN_NB=y PYTHONPATH=python .venv/bin/python bench/pipe/connect_time.py
    UCX_TLS=tcp UCX_TCP_CONN_NB=n PYTHONPATH=python .venv/bin/python bench/pipe/connect_time.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import tensorwire as tw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connects", type=int, default=40)
    args = ap.parse_args()
    times = []
    with tw.PipeListener(0) as listener:
        def accept_all() -> None:
            for _ in range(args.connects):
                pipe = listener.accept(timeout=30)
                if pipe is not None:
                    pipe.close()

        acceptor = threading.Thread(target=accept_all)
        acceptor.start()
        for _ in range(args.connects):
            t0 = time.perf_counter()
            pipe = tw.TensorDictPipe.connect("127.0.0.1", listener.port, timeout=30)
            times.append((time.perf_counter() - t0) * 1e3)
            pipe.close()
        acceptor.join()
    times.sort()
    setting = ", ".join(f"{k}={os.environ[k]}" for k in ("UCX_TLS", "UCX_TCP_CONN_NB")
                        if k in os.environ)
    print(f"{setting or 'defaults'}: {args.connects} connects, median "
          f"{statistics.median(times):.2f} ms, p90 {times[int(0.9 * (len(times) - 1))]:.2f} ms")


if __name__ == "__main__":
    main()
