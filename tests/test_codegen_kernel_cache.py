"""The compiler's on-disk kernel cache (oar_codegen.kernel_cache): the key covers everything that
changes a binary, entries that fail a check are never loaded, writers racing on one key never show
a reader part of an entry, the directory is private, a disk error never fails a build, and
``oar cache info`` / ``oar cache clear``."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
try:
    from oar_codegen import kernel_cache
except ImportError:  # the compiler's package is not installed yet: use the source tree
    sys.path.insert(0, str(REPO / "codegen"))
    from oar_codegen import kernel_cache

from oar_codegen.kernel_cache import CacheKey, KernelCache, KernelCacheWarning

# Where the CLI's subprocess finds oar_codegen: its installed copy if any, else the source tree.
CODEGEN_PATH = str(Path(kernel_cache.__file__).resolve().parents[1])


def make_key(**changes) -> CacheKey:
    fields = dict(source="void k(float* x) { x[0] = 1; }", target="c", lang="c",
                  compiler_identity="cc (Debian 12.2.0-14) 12.2.0", flags="-O3 -march=native",
                  abi_version="1.0", device_properties=(("arch", "x86-64-v3"), ("cores", "16")))
    fields.update(changes)
    return CacheKey(**fields)


def entry_files(root: Path) -> list[Path]:
    return sorted(root.glob("??/*.bin"))


# -- the key -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("source", "void k(float* x) { x[0] = 2; }"),
    ("target", "opencl"),
    ("lang", "opencl"),
    ("compiler_identity", "cc (Debian 13.1.0-1) 13.1.0"),
    ("flags", "-O2"),
    ("abi_version", "1.1"),
    ("device_properties", (("arch", "x86-64-v4"), ("cores", "16"))),
    ("device_properties", (("arch", "x86-64-v3"), ("cores", "8"))),
    ("device_properties", (("arch", "x86-64-v3"),)),
    ("device_properties", (("arch", "x86-64-v3"), ("cores", "16"), ("simd", "avx512"))),
])
def test_digest_changes_with_each_field(field, value):
    assert make_key(**{field: value}).digest() != make_key().digest()


def test_digest_is_unambiguous_and_order_free():
    # moving text between fields must not give the same encoding
    assert make_key(target="ab", lang="c").digest() != make_key(target="a", lang="bc").digest()
    assert (make_key(device_properties=(("a", "b,c"),)).digest()
            != make_key(device_properties=(("a", "b"), ("c", ""))).digest())
    reordered = make_key(device_properties={"cores": "16", "arch": "x86-64-v3"})
    assert reordered == make_key() and reordered.digest() == make_key().digest()
    assert len(make_key().digest()) == 64


def test_key_fields_are_checked():
    with pytest.raises(TypeError, match="flags"):
        make_key(flags=None)
    with pytest.raises(TypeError, match="device_properties"):
        make_key(device_properties=(("cores", 16),))
    with pytest.raises(ValueError, match="'arch' is given twice"):
        make_key(device_properties=(("arch", "a"), ("arch", "b")))


def test_digest_is_stable_across_processes():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from oar_codegen.kernel_cache import CacheKey; "
            "print(CacheKey(source='void k(float* x) { x[0] = 1; }', target='c', lang='c', "
            "compiler_identity='cc (Debian 12.2.0-14) 12.2.0', flags='-O3 -march=native', abi_version='1.0', "
            "device_properties=(('cores', '16'), ('arch', 'x86-64-v3'))).digest())")
    result = subprocess.run([sys.executable, "-c", code, CODEGEN_PATH], capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert result.stdout.strip() == make_key().digest()


# -- get / put ---------------------------------------------------------------------------------------

def test_put_get_roundtrip(tmp_path):
    cache = KernelCache(tmp_path / "kernels")
    key, binary = make_key(), bytes(range(256)) * 100
    assert cache.get(key) is None
    cache.put(key, binary)
    assert cache.get(key) == binary
    assert cache.get(make_key(flags="-O0")) is None
    path = cache.entry_path(key)
    assert path == tmp_path / "kernels" / key.digest()[:2] / f"{key.digest()}.bin"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (cache.stats.hits, cache.stats.misses, cache.stats.corrupt) == (1, 2, 0)
    assert KernelCache(tmp_path / "kernels").get(key) == binary  # another instance, same disk


def test_get_or_build(tmp_path):
    cache = KernelCache(tmp_path)
    builds = []

    def build():
        builds.append(1)
        return b"binary"

    assert cache.get_or_build(make_key(), build) == (b"binary", False)
    assert cache.get_or_build(make_key(), build) == (b"binary", True)
    assert len(builds) == 1
    with pytest.raises(TypeError, match="returned str, not bytes"):
        cache.get_or_build(make_key(source="other"), lambda: "text")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def foreign_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(b"NOTOURS!" + data[8:])


def other_key(path: Path) -> None:
    # a whole, valid entry, but for another key, under this key's name
    cache = KernelCache(path.parents[1])
    other = make_key(flags="-O0")
    cache.put(other, b"for another key")
    os.replace(cache.entry_path(other), path)


@pytest.mark.parametrize("damage", [truncate, flip_payload_byte, foreign_header, other_key])
def test_damaged_entry_is_a_miss_rebuilt_and_removed(tmp_path, damage):
    cache = KernelCache(tmp_path)
    key = make_key()
    cache.put(key, b"good binary " * 50)
    damage(cache.entry_path(key))
    # info reads headers only: a flipped payload byte shows on get
    assert cache.info().corrupt_entries == (0 if damage is flip_payload_byte else 1)
    assert cache.get(key) is None
    assert not cache.entry_path(key).exists()
    assert cache.stats.corrupt == 1
    cache.put(key, b"good binary " * 50)
    damage(cache.entry_path(key))
    binary, hit = cache.get_or_build(key, lambda: b"rebuilt")
    assert (binary, hit) == (b"rebuilt", False)
    assert cache.stats.rebuilt_corrupt == 1
    assert cache.get(key) == b"rebuilt"


# -- writers racing ----------------------------------------------------------------------------------

RACE_BINARY = bytes(range(251)) * 2000  # ~500 KiB: a torn write would show


def _race_writer(root: str, count: int) -> None:
    cache = KernelCache(root)
    for _ in range(count):
        cache.put(make_key(), RACE_BINARY)


def _race_reader(root: str, done, results) -> None:
    cache = KernelCache(root)
    seen = {"none": 0, "exact": 0, "other": 0}
    while True:
        finished = done.is_set()
        binary = cache.get(make_key())
        seen["none" if binary is None else "exact" if binary == RACE_BINARY else "other"] += 1
        if finished:
            break
    seen["corrupt"] = cache.stats.corrupt
    results.put(seen)


def test_concurrent_writers_never_show_a_partial_entry(tmp_path):
    context = multiprocessing.get_context("spawn")
    done, results = context.Event(), context.Queue()
    readers = [context.Process(target=_race_reader, args=(str(tmp_path), done, results)) for _ in range(2)]
    writers = [context.Process(target=_race_writer, args=(str(tmp_path), 50)) for _ in range(4)]
    for process in readers + writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    done.set()
    seen = [results.get(timeout=60) for _ in readers]
    for process in readers:
        process.join(60)
        assert process.exitcode == 0
    for counts in seen:
        assert counts["other"] == 0 and counts["corrupt"] == 0, counts
        assert counts["exact"] >= 1  # the last read is after every write
    assert KernelCache(tmp_path).get(make_key()) == RACE_BINARY
    assert [p.name for p in (tmp_path / make_key().digest()[:2]).iterdir()] == [f"{make_key().digest()}.bin"]


# -- the directory -----------------------------------------------------------------------------------

def test_directories_are_created_private(tmp_path):
    old_umask = os.umask(0)
    try:
        cache = KernelCache(tmp_path / "a" / "kernels")
        cache.put(make_key(), b"x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.entry_path(make_key()).parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_writable_root_is_refused(tmp_path, mode):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(mode)
    expected = f"writable by group or others.*chmod 700 {re.escape(str(root))}"
    with pytest.raises(kernel_cache.InsecureCacheDirError, match=expected):
        KernelCache(root)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_root_of_another_owner_is_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(kernel_cache.InsecureCacheDirError, match="owned by uid 65534"):
        KernelCache(root)


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(kernel_cache.KernelCacheError, match="not a directory"):
        KernelCache(tmp_path / "file")


def _failing_fsync(fd):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_warns_once_and_does_not_raise(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path)
    monkeypatch.setattr(kernel_cache.os, "fsync", _failing_fsync)
    with pytest.warns(KernelCacheWarning, match=f"{tmp_path}.*No space left on device") as caught:
        cache.put(make_key(), b"x")
        cache.put(make_key(source="another"), b"y")
        assert cache.get_or_build(make_key(source="third"), lambda: b"z") == (b"z", False)
    assert len(caught) == 1
    assert [path for path in tmp_path.rglob("*") if not path.is_dir()] == []  # no temp file left


def test_a_read_only_dir_warns_and_does_not_raise(tmp_path):
    cache = KernelCache(tmp_path)
    # a file where the entry's directory goes fails the write as a read-only directory would,
    # also for root, whom permission bits do not stop
    (tmp_path / make_key().digest()[:2]).write_text("in the way")
    readonly = tmp_path / "readonly"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.put(make_key(), b"x")
        if os.geteuid() != 0:
            KernelCache(readonly).get(make_key())
            readonly.chmod(0o500)
            KernelCache(readonly).put(make_key(), b"x")
            readonly.chmod(0o700)
    assert [w.category for w in caught] == [KernelCacheWarning] * (1 if os.geteuid() == 0 else 2)
    assert str(tmp_path / make_key().digest()[:2]) in str(caught[0].message)
    assert cache.get(make_key()) is None


def test_an_uncreatable_root_runs_uncached(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.warns(KernelCacheWarning, match="cannot create the kernel cache directory"):
        cache = KernelCache(tmp_path / "file" / "kernels")
    cache.put(make_key(), b"x")
    assert cache.get_or_build(make_key(), lambda: b"x") == (b"x", False)


def test_clear_removes_only_entries(tmp_path):
    cache = KernelCache(tmp_path)
    for index in range(3):
        cache.put(make_key(source=f"kernel {index}"), b"binary")
    shard = cache.entry_path(make_key(source="kernel 0")).parent
    unrelated = [tmp_path / "notes.txt", tmp_path / "ab" / "keep.bin", shard / "README",
                 tmp_path / "zz" / f"{'0' * 64}.bin", shard / f"{'f' * 64}.bin"]
    for path in unrelated:
        path.parent.mkdir(exist_ok=True)
        path.write_text("not a cache entry")
    stale = shard / f".{'0' * 16}.stale.tmp"
    fresh = shard / f".{'1' * 16}.fresh.tmp"
    stale.write_bytes(b"")
    fresh.write_bytes(b"")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert cache.info().entries == 3
    assert cache.clear() == 3
    left = sorted(path for path in tmp_path.rglob("*") if not path.is_dir())
    assert left == sorted(unrelated + [fresh])  # a temp file an hour old is a write that died

    assert cache.info().entries == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.txt", "ab", "zz", shard.name])


def test_default_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OAR_CACHE_DIR", str(tmp_path / "one"))
    first = kernel_cache.default_cache()
    assert first.root == tmp_path / "one" and kernel_cache.default_cache() is first
    monkeypatch.setenv("OAR_CACHE_DIR", str(tmp_path / "two"))
    assert kernel_cache.default_cache().root == tmp_path / "two"
    monkeypatch.delenv("OAR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert kernel_cache.default_cache().root == tmp_path / "xdg" / "oar" / "kernels"


# -- the CLI -----------------------------------------------------------------------------------------

def oar(*args: str, cache_dir: Path, codegen: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OAR_CACHE_DIR": str(cache_dir), "COLUMNS": "200"}
    if codegen:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [CODEGEN_PATH, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "oar.cli", *args], capture_output=True, text=True, env=env)


def test_cli_cache_info_and_clear(tmp_path):
    pytest.importorskip("oar.cli")
    root = tmp_path / "kernels"
    cache = KernelCache(root)
    cache.put(make_key(), b"a" * 1000)
    cache.put(make_key(target="opencl"), b"b" * 1000)
    (root / "unrelated.txt").write_text("keep me")

    result = oar("cache", "info", "--json", "--verbose", cache_dir=root)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["root"], data["entries"], data["corrupt_entries"]) == (str(root), 2, 0)
    assert data["total_bytes"] == sum(p.stat().st_size for p in entry_files(root))
    assert sorted(entry["key"]["target"] for entry in data["details"]) == ["c", "opencl"]

    result = oar("cache", "info", "--verbose", cache_dir=root)
    assert result.returncode == 0, result.stderr
    assert str(root) in result.stdout and "entries" in result.stdout and "opencl" in result.stdout

    result = oar("cache", "clear", cache_dir=root)
    assert result.returncode == 0, result.stderr
    assert f"removed 2 kernel cache entries from {root}" in " ".join(result.stdout.split())
    assert entry_files(root) == [] and (root / "unrelated.txt").read_text() == "keep me"


def test_cli_refuses_a_writable_cache_dir(tmp_path):
    pytest.importorskip("oar.cli")
    tmp_path.chmod(0o777)
    result = oar("cache", "info", cache_dir=tmp_path)
    assert result.returncode == 1
    assert "writable by group or others" in result.stderr and str(tmp_path) in result.stderr


def test_cli_without_the_compiler_says_so(tmp_path, monkeypatch):
    cli = pytest.importorskip("oar.cli")
    from click.testing import CliRunner

    monkeypatch.setitem(sys.modules, "oar_codegen", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "oar_codegen.kernel_cache", None)
    monkeypatch.setenv("OAR_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli.main, ["cache", "info"])
    assert result.exit_code == 1
    assert "oar_codegen package" in result.output and "not installed" in result.output


# -- nothing under the root is followed -------------------------------------------------------------

def _attacker_shard(tmp_path: Path, key: CacheKey) -> Path:
    """A valid entry for ``key`` in a directory the attacker controls; returns its shard."""
    attacker = KernelCache(tmp_path / "attacker")
    attacker.put(key, b"attacker's library")
    return attacker.entry_path(key).parent


def test_a_symlinked_shard_is_never_followed_shown_and_cleared(tmp_path):
    key = make_key()
    cache = KernelCache(tmp_path / "kernels")
    shard_link = cache.entry_path(key).parent
    target = _attacker_shard(tmp_path, key)
    shard_link.symlink_to(target)

    assert cache.get(key) is None
    with pytest.warns(KernelCacheWarning, match=f"{shard_link} is a symbolic link \\(to {target}\\), not a directory; "
                                                 f"`oar cache clear` removes it"):
        assert cache.get_or_build(key, lambda: b"own build") == (b"own build", False)
    assert (target / cache.entry_path(key).name).read_bytes().endswith(b"attacker's library")  # not written through
    summary = cache.info()
    assert [(item.path, item.problem) for item in summary.refused] == [
        (shard_link, f"a symbolic link (to {target}), not a directory")]

    cache.clear()
    assert not os.path.lexists(shard_link) and target.is_dir()  # the link went, its target stays
    assert cache.info().refused == ()
    cache.put(key, b"own build")
    assert cache.get(key) == b"own build"


def test_a_symlinked_entry_is_shown_and_cleared(tmp_path):
    key = make_key()
    cache = KernelCache(tmp_path / "kernels")
    cache.put(make_key(source="other"), b"x")
    entry = cache.entry_path(key)
    entry.parent.mkdir(exist_ok=True)
    target = _attacker_shard(tmp_path, key) / entry.name
    entry.symlink_to(target)
    assert [item.problem for item in cache.info().refused] == [f"a symbolic link (to {target}), not a regular file"]
    assert cache.clear() == 1
    assert not os.path.lexists(entry) and target.exists()


def test_a_fifo_in_place_of_an_entry_does_not_block(tmp_path):
    import threading

    key = make_key()
    cache = KernelCache(tmp_path)
    cache.put(key, b"binary")
    entry = cache.entry_path(key)
    entry.unlink()
    os.mkfifo(entry)
    result = []
    reader = threading.Thread(target=lambda: result.append(cache.get_or_build(key, lambda: b"rebuilt")), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open(): a writer end lets the thread finish, then fail
        os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("reading a FIFO in place of a kernel cache entry blocked")
    assert result == [(b"rebuilt", False)]
    assert cache.get(key) == b"rebuilt"


def test_info_and_clear_show_and_remove_special_files(tmp_path):
    cache = KernelCache(tmp_path)
    key = make_key()
    cache.put(key, b"binary")
    entry = cache.entry_path(key)
    entry.unlink()
    os.mkfifo(entry)
    other_shard = tmp_path / ("00" if entry.parent.name != "00" else "01")
    os.mkfifo(other_shard)
    problems = {item.path: item.problem for item in cache.info().refused}
    assert problems == {entry: "a FIFO, not a regular file", other_shard: "a FIFO, not a directory"}
    cache.clear()
    assert not os.path.lexists(entry) and not os.path.lexists(other_shard)


def test_a_shard_writable_by_others_is_refused(tmp_path):
    key = make_key()
    cache = KernelCache(tmp_path)
    cache.put(key, b"binary")
    entry = cache.entry_path(key)
    entry.parent.chmod(0o777)
    assert cache.get(key) is None
    assert [item.problem for item in cache.info().refused] == ["a directory writable by group or others (mode 0777)"]
    with pytest.warns(KernelCacheWarning, match="writable by group or others.*oar cache clear"):
        cache.put(key, b"binary")
    cache.clear()
    assert not entry.parent.exists()


def test_cli_shows_and_clears_a_symlinked_shard(tmp_path):
    pytest.importorskip("oar.cli")
    key = make_key()
    root = tmp_path / "kernels"
    cache = KernelCache(root)
    shard_link = cache.entry_path(key).parent
    shard_link.symlink_to(_attacker_shard(tmp_path, key))

    result = oar("cache", "info", "--json", cache_dir=root)
    assert result.returncode == 0, result.stderr
    refused = json.loads(result.stdout)["refused"]
    assert [(item["path"], item["problem"].split(" (")[0]) for item in refused] == [(str(shard_link), "a symbolic link")]
    result = oar("cache", "info", cache_dir=root)
    assert f"refused {shard_link}: a symbolic link" in " ".join(result.stdout.split())

    result = oar("cache", "clear", cache_dir=root)
    assert result.returncode == 0, result.stderr
    assert f"removed {shard_link}: a symbolic link" in " ".join(result.stdout.split())
    assert not os.path.lexists(shard_link)
