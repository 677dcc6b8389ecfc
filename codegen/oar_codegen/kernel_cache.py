"""The compiler's on-disk kernel cache: compiled kernel binaries keyed on everything that can
change them.

Location: ``$OAR_CACHE_DIR`` when set, else ``platformdirs.user_cache_dir("oar")/kernels``
(``~/.cache/oar/kernels`` on Linux, honouring ``$XDG_CACHE_HOME``). platformdirs rather than a
hand-written ``~/.cache``: it is tiny, pure Python, already in every environment that has pip's
tooling, and gives the right place on macOS and Windows too, where ``~/.cache`` is wrong.

Safety:

* the key (:class:`CacheKey`) holds the rendered source, the target, the module lang, the
  compiler's identity, the flags, the ABI version and the device properties that matter: a
  key missing any of them hands out a binary built for something else;
* the cache directory is created with mode 0700; an existing one that is group- or
  other-writable, or owned by another user, is refused (:class:`InsecureCacheDirError`):
  whoever can write the cache can make every process that reads it run their code;
* an entry (``root/<digest[:2]>/<digest>.bin``) carries a header with the key itself and the
  payload's sha256; :meth:`KernelCache.get` checks both and treats a failing entry as a miss
  (and removes it), so a truncated, flipped or foreign file is never loaded;
* :meth:`KernelCache.put` writes a temp file (0600) in the entry's directory, fsyncs it and
  renames it over the entry: readers see the old entry, the new one or none, never part of
  one, with any number of processes writing the same key;
* a disk that cannot take an entry (full, read-only) never fails compilation: one warning,
  then the process goes on without caching what it cannot write.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CacheKey", "KernelCache", "CacheInfo", "CacheStats", "EntryInfo",
    "KernelCacheError", "InsecureCacheDirError", "KernelCacheWarning",
    "default_cache", "default_cache_dir", "ENV_VAR",
]

ENV_VAR = "OAR_CACHE_DIR"

# Entry layout: header struct, then the key's canonical JSON, then the payload.
MAGIC = b"OARKCACH"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI32s32sQI")  # magic, format version, key digest, payload sha256, payload length, key length
_KEY_SCHEMA = "oar.kernel_cache.key/1"
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.bin")
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")
_TEMP_NAME = re.compile(r"\.[0-9a-f]{16}\..+\.tmp")
# A temp file this old belongs to a write that died; younger ones may be a write in progress.
_STALE_TEMP_SECONDS = 3600
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)


class KernelCacheError(Exception):
    """The kernel cache cannot be used as configured."""


class InsecureCacheDirError(KernelCacheError):
    """The cache directory is writable by others or owned by someone else."""


class KernelCacheWarning(UserWarning):
    """The kernel cache could not write; compilation goes on uncached."""


@dataclass(frozen=True)
class CacheKey:
    """Everything that can change a compiled kernel. ``device_properties`` may be given as a
    mapping or any iterable of (name, value) pairs; it is stored as sorted pairs."""

    source: str
    target: str
    lang: str
    compiler_identity: str
    flags: str
    abi_version: str
    device_properties: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name == "device_properties":
                continue
            value = getattr(self, field.name)
            if not isinstance(value, str):
                raise TypeError(f"CacheKey.{field.name} must be a str, not {type(value).__name__}")
        object.__setattr__(self, "device_properties", _sorted_properties(self.device_properties))

    @functools.cached_property
    def canonical_json(self) -> bytes:
        """The unambiguous encoding the digest is taken over (and the entry header stores)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["device_properties"] = [list(pair) for pair in self.device_properties]
        fields["schema"] = _KEY_SCHEMA
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    def digest(self) -> str:
        """sha256 hex of :attr:`canonical_json`: the entry's name."""
        return hashlib.sha256(self.canonical_json).hexdigest()


def _sorted_properties(properties: object) -> tuple[tuple[str, str], ...]:
    pairs = properties.items() if isinstance(properties, Mapping) else properties
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise TypeError(f"CacheKey.device_properties must be (name, value) pairs or a mapping, "
                        f"not {type(properties).__name__}")
    result: dict[str, str] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise TypeError(f"CacheKey.device_properties: each item must be a (name, value) pair, not {pair!r}")
        name, value = pair
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"CacheKey.device_properties: name and value must be str, got "
                            f"({type(name).__name__}, {type(value).__name__}) for {name!r}")
        if name in result:
            raise ValueError(f"CacheKey.device_properties: {name!r} is given twice")
        result[name] = value
    return tuple(sorted(result.items()))


@dataclass
class CacheStats:
    """This process's counts for one cache."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # entries that failed a check on get (and were removed)
    rebuilt_corrupt: int = 0  # get_or_build calls that rebuilt over a corrupt entry


@dataclass(frozen=True)
class EntryInfo:
    """One entry as its header describes it; ``problem`` says why it would not load."""

    path: Path
    digest: str
    size: int
    key: dict | None
    problem: str | None


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    entries: int
    total_bytes: int
    corrupt_entries: int  # entries whose header fails its checks now (get would remove them)
    stats: CacheStats
    details: tuple[EntryInfo, ...] = ()  # filled by info(verbose=True)


def default_cache_dir() -> Path:
    """``$OAR_CACHE_DIR`` if set (and not empty), else the user's cache directory + ``/kernels``."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return Path(os.path.abspath(os.path.expanduser(configured)))
    import platformdirs

    return Path(platformdirs.user_cache_dir("oar", appauthor=False)) / "kernels"


class KernelCache:
    """Compiled kernels on disk, one file per :class:`CacheKey`."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = default_cache_dir() if root is None else Path(os.path.abspath(os.fspath(root)))
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._write_warned = False
        self._usable = self._prepare_root()

    def __repr__(self) -> str:
        return f"KernelCache({str(self.root)!r})"

    # -- the directory ---------------------------------------------------------------------------

    def _prepare_root(self) -> bool:
        """Creates the root 0700 or checks the existing one; False: run uncached (warned)."""
        try:
            created = _make_private_dir(self.root, parents=True)
        except OSError as error:
            self._warn_write(f"cannot create the kernel cache directory {self.root}: {error}", stacklevel=5)
            return False
        if not created:
            _check_private_dir(self.root)
        return True

    def _warn_write(self, message: str, stacklevel: int = 4) -> None:
        """Once per cache; stacklevel points at the caller of the public method."""
        with self._lock:
            if self._write_warned:
                return
            self._write_warned = True
        warnings.warn(f"{message}; compiling without the kernel cache", KernelCacheWarning, stacklevel=stacklevel)

    def entry_path(self, key: CacheKey) -> Path:
        digest = key.digest()
        return self.root / digest[:2] / f"{digest}.bin"

    # -- get / put -------------------------------------------------------------------------------

    def get(self, key: CacheKey) -> bytes | None:
        """The binary stored for ``key``, or None (absent, or failed a check and was removed)."""
        payload, corrupt = self._load(key)
        with self._lock:
            if payload is not None:
                self.stats.hits += 1
            else:
                self.stats.misses += 1
                self.stats.corrupt += corrupt
        return payload

    def _load(self, key: CacheKey) -> tuple[bytes | None, bool]:
        if not self._usable:
            return None, False
        path = self.entry_path(key)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_BINARY)
        except FileNotFoundError:
            return None, False
        except OSError:
            # a symlink (O_NOFOLLOW) or an unreadable entry: not ours to trust
            _remove_if_same(path, None)
            return None, True
        with os.fdopen(fd, "rb") as file:
            opened = os.fstat(file.fileno())
            if not stat.S_ISREG(opened.st_mode):
                return None, True
            try:
                data = file.read()
            except OSError:
                data = b""
        problem, payload = _parse_entry(data, key.digest(), key.canonical_json)
        if problem is not None:
            _remove_if_same(path, opened)
            return None, True
        return payload, False

    def put(self, key: CacheKey, binary: bytes) -> None:
        """Stores ``binary`` under ``key`` atomically; a disk error warns once and is dropped."""
        payload = bytes(binary)
        if not self._usable:
            return
        path = self.entry_path(key)
        digest = key.digest()
        key_json = key.canonical_json
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, bytes.fromhex(digest),
                              hashlib.sha256(payload).digest(), len(payload), len(key_json))
        temp_path = None
        try:
            _make_private_dir(path.parent, parents=False)
            fd, temp_path = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as file:
                file.write(header)
                file.write(key_json)
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp_path, path)
            temp_path = None
        except OSError as error:
            self._warn_write(f"cannot write the kernel cache entry {path}: {error}")
        finally:
            if temp_path is not None:
                try:
                    os.unlink(temp_path)
                except OSError:
                    pass

    def get_or_build(self, key: CacheKey, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """(binary, was_hit): the cached binary, or ``build()``'s, which is then stored.
        Two processes missing at once both build; the last rename wins, both get a whole binary."""
        payload, corrupt = self._load(key)
        with self._lock:
            if payload is not None:
                self.stats.hits += 1
                return payload, True
            self.stats.misses += 1
            self.stats.corrupt += corrupt
            self.stats.rebuilt_corrupt += corrupt
        built = build()
        if not isinstance(built, bytes | bytearray | memoryview):
            raise TypeError(f"the build for kernel cache key {key.digest()[:16]} returned "
                            f"{type(built).__name__}, not bytes")
        binary = bytes(built)
        self.put(key, binary)
        return binary, False

    # -- inspection and clearing -----------------------------------------------------------------

    def _entry_files(self) -> Iterator[Path]:
        """Files named like entries (``<2 hex>/<64 hex>.bin``, prefix matching); nothing else."""
        try:
            shards = sorted(self.root.iterdir())
        except OSError:
            return
        for shard in shards:
            if not (_SHARD_NAME.fullmatch(shard.name) and shard.is_dir() and not shard.is_symlink()):
                continue
            try:
                names = sorted(os.listdir(shard))
            except OSError:
                continue
            for name in names:
                entry = shard / name
                if _ENTRY_NAME.fullmatch(name) and name.startswith(shard.name) and _is_regular_file(entry):
                    yield entry

    def entries(self) -> Iterator[EntryInfo]:
        """Each entry with its header read and checked (the payload's hash is checked on get)."""
        for path in self._entry_files():
            digest = path.name[:-len(".bin")]
            try:
                size = path.stat().st_size
                with open(path, "rb") as file:
                    problem, key_length = _parse_header(file.read(_HEADER.size), size, digest)
                    key_json = file.read(key_length) if problem is None else b""
            except OSError as error:
                yield EntryInfo(path, digest, 0, None, f"unreadable: {error}")
                continue
            key = None
            if problem is None:
                if hashlib.sha256(key_json).hexdigest() != digest:
                    problem = "the key stored in the header does not match the entry's digest"
                else:
                    key = json.loads(key_json)
            yield EntryInfo(path, digest, size, key, problem)

    def info(self, verbose: bool = False) -> CacheInfo:
        """Root, entry count, total bytes, entries failing their header checks; with ``verbose``
        each entry's details (its key's fields)."""
        details = tuple(self.entries())
        with self._lock:
            stats = dataclasses.replace(self.stats)
        return CacheInfo(root=self.root, entries=len(details), total_bytes=sum(d.size for d in details),
                         corrupt_entries=sum(d.problem is not None for d in details), stats=stats,
                         details=details if verbose else ())

    def clear(self) -> int:
        """Removes every entry (and temp files left by writes that died, and shard directories
        left empty); returns the entries removed. Other files are left alone."""
        removed = 0
        for path in list(self._entry_files()):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        try:
            shards = [s for s in self.root.iterdir() if _SHARD_NAME.fullmatch(s.name) and s.is_dir()
                      and not s.is_symlink()]
        except OSError:
            shards = []
        now = time.time()
        for shard in shards:
            try:
                for temp in shard.iterdir():
                    if (_TEMP_NAME.fullmatch(temp.name) and _is_regular_file(temp)
                            and now - temp.lstat().st_mtime > _STALE_TEMP_SECONDS):
                        temp.unlink()
                shard.rmdir()
            except OSError:
                pass  # not empty (someone else's file, a write in progress) or gone
        return removed


# -- entry encoding ------------------------------------------------------------------------------

def _parse_header(head: bytes, file_size: int, digest: str) -> tuple[str | None, int]:
    """(problem or None, key JSON length)."""
    if len(head) < _HEADER.size:
        return f"shorter than the {_HEADER.size}-byte header", 0
    magic, version, stored_digest, _, payload_length, key_length = _HEADER.unpack(head)
    if magic != MAGIC:
        return "not a kernel cache entry (wrong magic)", 0
    if version != FORMAT_VERSION:
        return f"format version {version}, this Oar reads {FORMAT_VERSION}", 0
    if stored_digest.hex() != digest:
        return "the header's key digest is not the entry's", 0
    if _HEADER.size + key_length + payload_length != file_size:
        return (f"truncated or padded: header says {_HEADER.size + key_length + payload_length} bytes, "
                f"file has {file_size}"), 0
    return None, key_length


def _parse_entry(data: bytes, digest: str, key_json: bytes) -> tuple[str | None, bytes | None]:
    """(problem or None, payload): every check an entry must pass before it is loaded."""
    problem, key_length = _parse_header(data[:_HEADER.size], len(data), digest)
    if problem is not None:
        return problem, None
    payload_sha256 = _HEADER.unpack(data[:_HEADER.size])[3]
    stored_key = data[_HEADER.size:_HEADER.size + key_length]
    if stored_key != key_json:
        return "the stored key is not the requested one", None
    payload = data[_HEADER.size + key_length:]
    if hashlib.sha256(payload).digest() != payload_sha256:
        return "the payload's sha256 does not match the header", None
    return None, payload


# -- the filesystem ------------------------------------------------------------------------------

def _make_private_dir(path: Path, parents: bool) -> bool:
    """mkdir 0700; True if it was created here, False if it already existed."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    os.chmod(path, 0o700)  # whatever the umask
    return True


def _check_private_dir(path: Path) -> None:
    try:
        info = os.stat(path)
    except OSError as error:
        raise KernelCacheError(f"kernel cache directory {path}: {error}") from error
    if not stat.S_ISDIR(info.st_mode):
        raise KernelCacheError(f"kernel cache directory {path} exists and is not a directory; "
                               f"remove it or set {ENV_VAR} elsewhere")
    if os.name != "posix":
        return
    if info.st_uid != os.geteuid():
        raise InsecureCacheDirError(
            f"kernel cache directory {path} is owned by uid {info.st_uid}, not by this user "
            f"(uid {os.geteuid()}): its owner could make this process run their code. "
            f"Set {ENV_VAR} to a directory of your own.")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InsecureCacheDirError(
            f"kernel cache directory {path} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}): anyone who can write it could make this process "
            f"run their code. Run `chmod 700 {path}` then `oar cache clear` (entries others wrote "
            f"can't be trusted), or set {ENV_VAR} to a private directory.")


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _remove_if_same(path: Path, opened: os.stat_result | None) -> None:
    """Removes a bad entry, unless a writer has renamed a new file over it since it was read."""
    try:
        now = os.lstat(path)
        if opened is None or (now.st_ino, now.st_dev) == (opened.st_ino, opened.st_dev):
            os.unlink(path)
    except OSError:
        pass


# -- the process-wide cache ----------------------------------------------------------------------

_default_lock = threading.Lock()
_default: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process's cache at :func:`default_cache_dir`; a new one when that path changes."""
    global _default
    root = default_cache_dir()
    with _default_lock:
        if _default is None or _default.root != root:
            _default = KernelCache(root)
        return _default
