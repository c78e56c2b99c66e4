"""``eaglebox capture-server``: the capture server of online training on its own, for a trainer's
``train.online.url`` (on another host through the Mooncake store, or beside several trainers), launched
as ``eaglebox train`` launches its own; in the foreground until interrupted."""

import signal
import threading

from eaglebox.errors import EagleboxError


def run(cfg) -> int:
    from eaglebox.extract.online import online_capture_server, spool_of
    from eaglebox.shards.spec import capture_spec

    o = cfg.train.online
    spool = spool_of(cfg)
    spool.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with online_capture_server(cfg, capture_spec(cfg), spool) as srv:
        print(f"capture-server: {srv.url} (train.online.url), files in {spool}"
              + (f", the Mooncake store at {o.mooncake.master}" if o.transport == "mooncake" else "")
              + f"; log {srv.log_path}", flush=True)
        while not stop.wait(1):
            if srv.proc.poll() is not None:
                raise EagleboxError(f"the capture server at {srv.url} exited ({srv.proc.returncode}); see {srv.log_path}")
    return 0
