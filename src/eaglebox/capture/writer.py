"""The capture sink's writer process: hashes, writes and fsyncs the samples the scheduler completed.

Started by :class:`eaglebox.capture.sink.CaptureSink` as
``python -m eaglebox.capture.writer MEMFD SOCKET WRITERS NICE PARENT_PID OUT_DIR``: it maps the sink's
shared memory (``MEMFD``), reads one message per completed sample from ``SOCKET`` (the region's offset, the
sample's name, where the ids and rows lie in the region, the capture header), has one of ``WRITERS``
threads write it (:func:`eaglebox.capture.sink.write_sample`: the same bytes as ever) through the
transport (:class:`eaglebox.shards.transport.SinkTransport`: the file ``OUT_DIR/<name>.safetensors``, or
for a name ``mooncake:<key>`` the key in the Mooncake store, when the server was launched with its settings),
and answers
(offset, error or None, seconds hashing, seconds writing); the sink then reuses the region.

Its own interpreter, so its threads wait for no one's GIL. It dies with the thread of the scheduler
that started it (``PR_SET_PDEATHSIG``; SIGKILL, as a kill -9 of the scheduler would leave it), and it
exits once the socket is closed and the samples it was sent are written.
"""

from __future__ import annotations

import mmap
import os
import queue
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from eaglebox.engine.server import die_with_parent


def main(argv: list[str]) -> None:
    memfd, sock, writers, nice, parent = (int(a) for a in argv[:5])
    die_with_parent(parent)
    if nice:  # this thread; every thread started later (writers, torch's) inherits it
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    import torch

    from eaglebox.capture.sink import region_views, write_sample
    from eaglebox.shards.transport import SinkTransport

    torch.set_num_threads(1)  # parallel across samples (the writer threads), not within one
    mm = mmap.mmap(memfd, os.fstat(memfd).st_size)
    os.close(memfd)
    base = torch.frombuffer(mm, dtype=torch.uint8)
    conn = Connection(sock)
    out_dir = Path(argv[5])
    transport = SinkTransport(out_dir)  # with Mooncake settings: connects and mounts its segment first
    jobs: queue.Queue = queue.Queue()
    answer = threading.Lock()

    def write_loop() -> None:
        while (job := jobs.get()) is not None:
            offset, name, layout, header = job
            try:
                ids, aux, last = region_views(base, offset, layout)
                _, hash_s, write_s = write_sample(out_dir / f"{name}.safetensors", ids, [aux], [last], header,
                                                  put=lambda blobs, name=name: transport.put(name, blobs))
                reply = (offset, None, hash_s, write_s)
            except Exception as err:  # raised in the scheduler by its next add_chunk / flush
                reply = (offset, repr(err), 0.0, 0.0)
            with answer:
                conn.send(reply)

    threads = [threading.Thread(target=write_loop, name=f"eaglebox-capture-writer-{i}") for i in range(writers)]
    for t in threads:
        t.start()
    while True:
        try:
            jobs.put(conn.recv())
        except EOFError:
            break
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1:])
