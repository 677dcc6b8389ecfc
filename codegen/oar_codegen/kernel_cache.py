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
  then the process goes on without caching what it cannot write;
* below the root nothing is followed or trusted by name: each shard directory and entry is opened
  relative to its parent's descriptor with ``O_NOFOLLOW`` (``O_NONBLOCK`` too, so a FIFO cannot
  block) and must be a directory / regular file owned by this user; anything else is refused
  (:class:`RefusedItem`), shown by :meth:`KernelCache.info` and removed by :meth:`KernelCache.clear`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import secrets
import stat
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CacheKey", "KernelCache", "CacheInfo", "CacheStats", "EntryInfo", "RefusedItem",
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
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


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
class RefusedItem:
    """Something under the root, named as a shard or an entry, that is never followed or loaded:
    a symbolic link, a FIFO or other special file, a file or directory of another user, a shard
    directory writable by others. :meth:`KernelCache.clear` removes it."""

    path: Path
    problem: str


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    entries: int
    total_bytes: int
    corrupt_entries: int  # entries whose header fails its checks now (get would remove them)
    stats: CacheStats
    details: tuple[EntryInfo, ...] = ()  # filled by info(verbose=True)
    refused: tuple[RefusedItem, ...] = ()  # always filled: each one is a problem to show


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
        digest = key.digest()
        name = f"{digest}.bin"
        try:
            shard_fd = self._open_shard(digest[:2], create=False)
        except (OSError, _Refused):
            return None, False  # absent, or refused (shown by info, removed by clear): never followed
        try:
            try:
                fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_BINARY, dir_fd=shard_fd)
            except FileNotFoundError:
                return None, False
            except OSError:
                # a symlink (O_NOFOLLOW) or an unreadable entry: not ours to trust
                _remove_if_same(shard_fd, name, None)
                return None, True
            with os.fdopen(fd, "rb") as file:
                opened = os.fstat(file.fileno())
                if _entry_problem(opened) is not None:
                    _remove_if_same(shard_fd, name, opened)  # a FIFO, device or foreign file
                    return None, True
                try:
                    data = file.read(opened.st_size + 1)  # bounded: a file that grows is torn anyway
                except OSError:
                    data = b""
            problem, payload = _parse_entry(data, digest, key.canonical_json)
            if problem is not None:
                _remove_if_same(shard_fd, name, opened)
                return None, True
            return payload, False
        finally:
            os.close(shard_fd)

    def _open_shard(self, shard: str, create: bool) -> int:
        """A descriptor of the shard directory, opened below the root without following links and
        checked (a directory, this user's, not writable by others); ``_Refused`` otherwise."""
        root_fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY)
        try:
            if create:
                try:
                    os.mkdir(shard, 0o700, dir_fd=root_fd)
                except FileExistsError:
                    pass
            try:
                fd = os.open(shard, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_NONBLOCK, dir_fd=root_fd)
            except FileNotFoundError:
                raise
            except OSError as error:
                info = os.stat(shard, dir_fd=root_fd, follow_symlinks=False)
                raise _Refused(_dir_problem(info, self.root / shard) or str(error)) from error
        finally:
            os.close(root_fd)
        problem = _dir_problem(os.fstat(fd))
        if problem is not None:
            os.close(fd)
            raise _Refused(problem)
        return fd

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
        temp_name = None
        shard_fd = None
        try:
            try:
                shard_fd = self._open_shard(digest[:2], create=True)
            except _Refused as refused:
                raise OSError(f"{path.parent} is {refused}; `oar cache clear` removes it") from None
            temp_name = f".{digest[:16]}.{secrets.token_hex(8)}.tmp"
            fd = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY, 0o600,
                         dir_fd=shard_fd)
            with os.fdopen(fd, "wb") as file:
                file.write(header)
                file.write(key_json)
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp_name, path.name, src_dir_fd=shard_fd, dst_dir_fd=shard_fd)
            temp_name = None
        except OSError as error:
            self._warn_write(f"cannot write the kernel cache entry {path}: {error}")
        finally:
            if shard_fd is not None:
                if temp_name is not None:
                    try:
                        os.unlink(temp_name, dir_fd=shard_fd)
                    except OSError:
                        pass
                os.close(shard_fd)

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

    def _scan(self) -> tuple[list[Path], list[RefusedItem]]:
        """(entries, refused): files named like entries (``<2 hex>/<64 hex>.bin``, prefix matching)
        that are this user's regular files in trusted shards, and whatever is named like a shard or
        an entry but is not that. Nothing is followed; files named otherwise are not looked at."""
        entries: list[Path] = []
        refused: list[RefusedItem] = []
        try:
            shards = sorted(os.scandir(self.root), key=lambda item: item.name)
        except OSError:
            return entries, refused
        for shard in shards:
            if not _SHARD_NAME.fullmatch(shard.name):
                continue
            try:
                problem = _dir_problem(shard.stat(follow_symlinks=False), Path(shard.path))
            except OSError:
                continue
            if problem is not None:
                refused.append(RefusedItem(Path(shard.path), problem))
                continue
            try:
                names = sorted(os.scandir(shard.path), key=lambda item: item.name)
            except OSError:
                continue
            for item in names:
                if not (_ENTRY_NAME.fullmatch(item.name) and item.name.startswith(shard.name)):
                    continue
                try:
                    problem = _entry_problem(item.stat(follow_symlinks=False), Path(item.path))
                except OSError:
                    continue
                if problem is None:
                    entries.append(Path(item.path))
                else:
                    refused.append(RefusedItem(Path(item.path), problem))
        return entries, refused

    def _entry_files(self) -> Iterator[Path]:
        yield from self._scan()[0]

    def entries(self) -> Iterator[EntryInfo]:
        """Each entry with its header read and checked (the payload's hash is checked on get)."""
        for path in self._entry_files():
            digest = path.name[:-len(".bin")]
            try:
                fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_BINARY)
                with os.fdopen(fd, "rb") as file:
                    opened = os.fstat(file.fileno())
                    if _entry_problem(opened) is not None:
                        continue  # replaced since the scan: the next info shows it
                    size = opened.st_size
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
                         details=details if verbose else (), refused=tuple(self._scan()[1]))

    def clear(self) -> int:
        """Removes every entry, everything refused (:class:`RefusedItem`: links are removed, never
        followed), temp files left by writes that died, and shard directories left empty; returns
        the entries removed. Files named otherwise are left alone."""
        removed = 0
        entries, refused = self._scan()
        for path in entries:
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        for item in refused:
            _remove_refused(item.path)
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


class _Refused(Exception):
    """A shard that is not this user's private directory: never followed or written."""


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _link_note(path: Path | None, info: os.stat_result) -> str:
    if path is None or not stat.S_ISLNK(info.st_mode):
        return ""
    try:
        return f" (to {os.readlink(path)})"
    except OSError:
        return ""


def _dir_problem(info: os.stat_result, path: Path | None = None) -> str | None:
    """Why a shard (lstat/fstat) is not trusted, or None."""
    if not stat.S_ISDIR(info.st_mode):
        return f"{_kind(info)}{_link_note(path, info)}, not a directory"
    if os.name == "posix" and info.st_uid != os.geteuid():
        return f"a directory owned by uid {info.st_uid}, not by this user"
    if os.name == "posix" and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"a directory writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _entry_problem(info: os.stat_result, path: Path | None = None) -> str | None:
    """Why an entry (lstat/fstat) is never loaded, or None."""
    if not stat.S_ISREG(info.st_mode):
        return f"{_kind(info)}{_link_note(path, info)}, not a regular file"
    if os.name == "posix" and info.st_uid != os.geteuid():
        return f"a file owned by uid {info.st_uid}, not by this user"
    return None


def _remove_refused(path: Path) -> None:
    """Unlinks a link or file, removes a directory's tree without following links (rmtree does not)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        pass  # gone, or not ours to remove: the next info still shows it


def _remove_if_same(dir_fd: int, name: str, opened: os.stat_result | None) -> None:
    """Removes a bad entry, unless a writer has renamed a new file over it since it was read."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if opened is None or (now.st_ino, now.st_dev) == (opened.st_ino, opened.st_dev):
            os.unlink(name, dir_fd=dir_fd)
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
