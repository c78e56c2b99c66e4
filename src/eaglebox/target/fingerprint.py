"""The target's identity, as the capture spec records it: its config, its weights, its tokenizer.

Serving compares it with the draft's (``serve/provenance.py``): a draft trained on one target's
features is refused on another, also when the two share a byte-identical ``config.json`` and differ
in one RMSNorm weight. Every byte of the weights is hashed, fast enough for a 600 GB target: each
file in :data:`CHUNK_BYTES` chunks, hashed by a thread pool (sha256 releases the GIL, and so does the
read), and named by the sha256 of its size and its chunks' digests (:data:`ALGORITHM`, recorded). A
file's digest is cached by its path, size, mtime, inode and ctime (:func:`_identity`), so a later
command does not rehash it; a file changed within :data:`RACY_S` of hashing is not cached (the clock
may not have ticked between two writes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from eaglebox.errors import EagleboxError

CHUNK_BYTES = 16 << 20
ALGORITHM = f"sha256-tree-{CHUNK_BYTES >> 20}MiB"
"""How ``weights_digest`` is computed; a fingerprint made otherwise is not comparable (:func:`stale`)."""
RACY_S = 2.0
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer*", "tokenization_*.py", "special_tokens_map.json", "added_tokens.json", "vocab.*",
                   "merges.txt", "*.tiktoken", "tiktoken.model", "chat_template*")
"""What transformers (and custom tokenizer code such as Kimi's) reads to tokenize."""

WHAT = {"config_sha256": "config.json", "weights_digest": "weights (every byte of the safetensors files and index)",
        "weights_algorithm": "weights' hash algorithm", "tokenizer_sha256": "tokenizer files"}
"""What each item of :func:`target_fingerprint` covers, for messages."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stale(target: dict) -> str | None:
    """Why a recorded fingerprint ``target`` cannot be compared with this eaglebox's (None if it can)."""
    if target.get("weights_algorithm") == ALGORITHM:
        return None
    made = target.get("weights_algorithm") or "32 sampled 64 KiB blocks a file (weights_sha256)"
    return f"made by an older eaglebox ({made}); this eaglebox hashes every byte ({ALGORITHM}): they cannot be compared"


def cache_path() -> Path:
    """``$EAGLEBOX_CACHE`` (compose sets it to a folder of the data volume: containers are removed after
    each command), else ``$XDG_CACHE_HOME/eaglebox``, else ``~/.cache/eaglebox``."""
    folder = os.environ.get("EAGLEBOX_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eaglebox"
    return Path(folder) / "weights-digests.json"


def _chunk_digest(fd: int, offset: int) -> bytes:
    return hashlib.sha256(os.pread(fd, CHUNK_BYTES, offset)).digest()


@contextmanager
def _cache_lock(cache_file: Path):
    """One process at a time reads, hashes and writes the cache: torchrun's ranks all fingerprint the
    target, and the first one's digests then serve the others (a 600 GB target read once, not per rank)."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache_file.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:  # a read-only home: no cache to share
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def file_digests(paths: list[Path], threads: int | None = None) -> dict[Path, str]:
    """Each file's digest (:data:`ALGORITHM`), from the cache when its :func:`_identity` is the cached
    one; the others' chunks all go to one pool, so many small files hash as fast as one large one."""
    cache_file = cache_path()
    with _cache_lock(cache_file):
        return _file_digests(paths, threads or os.cpu_count(), cache_file)


def _identity(st: os.stat_result) -> dict:
    """What a cached digest is trusted by. mtime alone can be set back (``touch -r``, ``cp -p``, ``rsync
    -t``); a file swapped in has another inode, and any write or ``utime`` moves the ctime, which no
    call can set back."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
            "algorithm": ALGORITHM}


def _file_digests(paths: list[Path], threads: int, cache_file: Path) -> dict[Path, str]:
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    stats = {p: p.stat() for p in paths}
    out, todo = {}, []
    for p in paths:
        hit = cache.get(str(p.resolve())) or {}
        if all(hit.get(k) == v for k, v in _identity(stats[p]).items()):
            out[p] = hit["digest"]
        else:
            todo.append(p)
    if not todo:
        return out
    fds = {p: os.open(p, os.O_RDONLY) for p in todo}
    try:
        with ThreadPoolExecutor(threads) as pool:
            chunks = {p: [pool.submit(_chunk_digest, fds[p], off) for off in range(0, stats[p].st_size, CHUNK_BYTES)]
                      for p in todo}
            for p in todo:
                h = hashlib.sha256(f"{ALGORITHM}:{stats[p].st_size}:".encode())
                for c in chunks[p]:
                    h.update(c.result())
                out[p] = h.hexdigest()
    finally:
        for fd in fds.values():
            os.close(fd)
    now = time.time_ns()
    for p in todo:
        st = stats[p]
        if _identity(os.stat(p)) == _identity(st) and now - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_S * 1e9:
            cache[str(p.resolve())] = _identity(st) | {"digest": out[p]}
    try:
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, cache_file)
    except OSError:  # a read-only home: the next command hashes again
        pass
    return out


def weights_digest(model_path: Path) -> str:
    """Every byte of the weight files named by the safetensors index (its bytes included), or of every
    ``*.safetensors``."""
    index = model_path / INDEX
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (model_path / n).exists()]
        if missing:
            raise EagleboxError(f"{index} names {missing[:3]}, which are not in {model_path}")
        files, index_sha = [model_path / n for n in names], _sha256(index.read_bytes())
    else:
        files, index_sha = sorted(model_path.glob("*.safetensors")), None
    digests = file_digests(files)
    entries = [[f.name, f.stat().st_size, digests[f]] for f in files]
    return _sha256(json.dumps({"index_sha256": index_sha, "files": entries}, sort_keys=True).encode())


def tokenizer_sha256(model_path: Path) -> str:
    files = sorted({p for pattern in TOKENIZER_FILES for p in model_path.glob(pattern) if p.is_file()})
    return _sha256(json.dumps([[p.name, _sha256(p.read_bytes())] for p in files]).encode())


def target_fingerprint(model_path: Path) -> dict:
    """One digest per item of :data:`WHAT` (and the weights' algorithm), computed once a command
    (through the capture spec)."""
    model_path = Path(model_path)
    return {"config_sha256": _sha256((model_path / "config.json").read_bytes()),
            "weights_digest": weights_digest(model_path), "weights_algorithm": ALGORITHM,
            "tokenizer_sha256": tokenizer_sha256(model_path)}
