"""``eaglebox capture-server``: the capture server of online training on its own, for a trainer's
``train.online.url`` (on another host through the Mooncake store, or beside several trainers), launched
as ``eaglebox train`` launches its own; in the foreground until interrupted."""

import signal
import threading
from pathlib import Path

from eaglebox.errors import EagleboxError


def run(cfg) -> int:
    from eaglebox.extract.run import capture_server
    from eaglebox.shards.spec import capture_spec
    from eaglebox.shards.transport import server_env

    o = cfg.train.online
    spool = Path(o.spool_dir or Path(cfg.train.output_dir) / "spool")
    spool.mkdir(parents=True, exist_ok=True)
    mooncake = o.transport == "mooncake"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log = spool.parent / "capture-server.log"
    with capture_server(cfg, capture_spec(cfg), log, capture_dir=spool,
                        transport_env=server_env(o.mooncake.model_dump()) if mooncake else None) as srv:
        print(f"capture-server: {srv.url} (train.online.url), files in {spool}"
              + (f", the Mooncake store at {o.mooncake.master}" if mooncake else "") + f"; log {log}", flush=True)
        while not stop.wait(1):
            if srv.proc.poll() is not None:
                raise EagleboxError(f"the capture server at {srv.url} exited ({srv.proc.returncode}); see {log}")
    return 0
