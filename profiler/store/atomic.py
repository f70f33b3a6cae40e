"""Files and directories that appear at their destination in one rename, built in exclusive
temporaries: what the run writer (profiler.store.runstore) and the Perfetto export share.

Temporaries are hidden siblings of the destination, `.<name>.<12 hex>.tmp` (one file system, so
the rename is atomic), created exclusively (O_CREAT | O_EXCL | O_NOFOLLOW for files, mkdir for
directories: never an existing file, never through a symlink; `export -o X` wrote through a
symlinked `X.tmp` and destroyed a user's file, issue 19), and locked (flock) while their writer
lives. A writer that dies leaves its temporary unlocked: the next write to the same destination
removes it (`clean_leftovers`), and one still locked belongs to a live writer and is left alone.

Placing: `place(tmp, dest, replace=False)` never replaces anything (renameat2 RENAME_NOREPLACE
where the kernel has it); replace=True replaces only a regular file (never a FIFO, a device, a
directory or a symlink: `--force` onto a FIFO replaced it, issue 19).

Reading (`open_regular`, `read_regular`): what a reader of a run opens is a regular file, opened
without blocking (a FIFO named `analysis-summary.json` hung the Runs page and then every request,
issue 32), checked with fstat on the open file (not on the path, which may change between), its
links resolved inside the roots the caller allows, and read up to a bound.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import sys
import uuid
from pathlib import Path

from ..errors import NotRegularFile, OutsideRoots, RunExists

# renameat2(2) flags (linux/fs.h): fail if the target exists; swap source and target atomically.
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


# Longest destination name a temporary repeats whole: with the dot, 12 hex digits, `.tmp` and
# `.old` it stays under the 255 bytes a file name may have (a 250-character run name could not
# be written, issue 32); a longer one is shortened and told apart by a digest of it.
MAX_STEM_BYTES = 200


def _stem(name: str) -> str:
    if len(os.fsencode(name)) <= MAX_STEM_BYTES:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    return f"{os.fsdecode(os.fsencode(name)[:100])}~{digest}"


def temp_name(dest: Path) -> Path:
    return dest.with_name(f".{_stem(dest.name)}.{uuid.uuid4().hex[:12]}.tmp")


def _leftover_pattern(name: str) -> re.Pattern:
    # 12 hex digits: temp_name; 32: update_manifest's temporaries before this module; `.old`:
    # the run a two-step overwrite moved aside (runstore._place)
    return re.compile(rf"\.{re.escape(_stem(name))}\.([0-9a-f]{{12}}|[0-9a-f]{{32}})\.tmp(\.old)?")


def _lock(fd: int) -> bool:
    """Take fd's exclusive lock without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class TempFile:
    """A new file beside `dest`, open for writing and locked: `with TempFile(dest) as t:
    write to t.file; t.place(replace)`. Removed on any failure, and on leaving the block
    unplaced."""

    def __init__(self, dest: Path):
        self.dest = Path(dest)
        self.path = temp_name(self.dest)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.file = os.fdopen(fd, "wb")
        self.placed: Path | None = None

    def size(self) -> int:
        """Bytes written so far (safe from another thread: a progress display asks)."""
        try:
            return os.fstat(self.file.fileno()).st_size
        except (OSError, ValueError):
            return 0

    def place(self, replace: bool = False) -> Path:
        self.file.flush()
        os.fsync(self.file.fileno())
        place(self.path, self.dest, replace)
        self.placed = self.dest
        return self.dest

    def __enter__(self) -> "TempFile":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.file.close()
        finally:
            if self.placed is None:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def create_exclusive(path: Path):
    """A new file at path opened for binary writing; FileExistsError if anything is there
    (a symlink included: it is not followed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, "wb")


def make_temp_dir(dest: Path) -> tuple[Path, int]:
    """A new hidden directory beside dest and the fd holding its lock (close it when done)."""
    tmp = temp_name(dest)
    os.mkdir(tmp)   # exclusive; the umask applies as for any directory the user makes
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return tmp, fd


@contextlib.contextmanager
def staged_dir(dest: Path):
    """A new locked temporary directory beside dest for a write the caller places at dest in one
    rename inside the block: earlier writes' temporaries of dest that died are removed first; the
    directory is removed when the block fails; its lock is released when the block ends."""
    clean_leftovers(dest)
    tmp, fd = make_temp_dir(dest)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def clean_leftovers(dest: Path) -> list[str]:
    """Remove the temporaries of earlier writes to dest that no live writer holds (a crash or
    kill -9 left them); returns their names. Only names of our pattern, never through a link.
    A run an overwrite moved aside (`.old`, runstore._swap_in_two_steps) whose writer died before
    the new run took its name is put back at dest first, never removed while dest is missing."""
    dest = Path(dest)
    pat = _leftover_pattern(dest.name)
    removed = []
    try:
        names = sorted((n for n in os.listdir(dest.parent) if pat.fullmatch(n)), key=lambda n: not n.endswith(".old"))
    except OSError:
        return removed
    for n in names:
        if n.endswith(".old") and not os.path.lexists(dest) and _restore(dest.parent / n, dest):
            removed.append(n)
            continue
        p = dest.parent / n
        try:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                os.unlink(p)            # not ours to follow: the link alone goes
                removed.append(n)
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)):
                continue
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
        except OSError:
            continue
        try:
            if not _lock(fd):
                continue                # a live writer's
            if is_dir:
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
            removed.append(n)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _restore(old: Path, dest: Path) -> bool:
    """Rename the moved-aside directory `old` back to dest, if no live writer holds it."""
    try:
        fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _lock(fd) and rename_noreplace(old, dest)
    except OSError:
        return False
    finally:
        os.close(fd)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2 on Linux; False where the system or file system lacks it (the caller falls back)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(e, os.strerror(e), str(dst))


def rename_exchange(src: Path, dst: Path) -> bool:
    """Swap src and dst in one step; False where the system cannot."""
    return _renameat2(src, dst, RENAME_EXCHANGE)


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Move src to dst unless dst exists; False when it does."""
    try:
        if _renameat2(src, dst, RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    if os.path.lexists(dst):   # fallback: a writer racing between this check and the rename loses
        return False
    os.rename(src, dst)
    return True


def is_regular(p: Path) -> bool:
    """p is a regular file itself (not a symlink to one)."""
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except FileNotFoundError:
        return False


def place(tmp: Path, dest: Path, replace: bool = False) -> Path:
    """Rename tmp to dest. Without replace an existing dest is refused (RunExists); with it,
    only a regular file is replaced (the rename swaps it in one step, never writing through)."""
    if rename_noreplace(tmp, dest):
        return dest
    if not replace:
        raise RunExists(f"{dest}: exists; not replacing it")
    if not is_regular(dest):
        raise RunExists(f"{dest}: exists and is not a regular file (a link, directory, FIFO or device); "
                        "not replacing it")
    os.replace(tmp, dest)
    return dest


# -- reading -------------------------------------------------------------------------------------
def inside(real: Path, within) -> bool:
    """real (a resolved path) lies in one of the resolved roots `within` (None: anywhere)."""
    return within is None or any(real == r or r in real.parents for r in within)


def open_regular(path, label: str | None = None, *, within=None):
    """path opened for binary reading, if it is a regular file: links are resolved first and must
    lead inside `within` (resolved roots; None: anywhere), else OutsideRoots; the last component is
    then opened without following a link and without blocking (a FIFO's open would wait for a
    writer), and the open file must be a regular file, else NotRegularFile. OSError (missing,
    permissions) is the caller's."""
    label = str(path) if label is None else label
    real = Path(os.path.realpath(path))
    if not inside(real, within):
        raise OutsideRoots(f"{label}: resolves outside the allowed roots; not read")
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{label}: not a regular file ({_kind(st.st_mode)}); not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def read_regular(path, max_bytes: int, label: str | None = None, *, within=None) -> bytes:
    """The whole content of the regular file at path (open_regular), refused (NotRegularFile)
    when it holds more than max_bytes: a link to /dev/zero or a 90 MB summary is never read whole."""
    label = str(path) if label is None else label
    with open_regular(path, label, within=within) as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise NotRegularFile(f"{label}: {os.fstat(f.fileno()).st_size:,} bytes, more than such a file may hold "
                                 f"({max_bytes:,}); not read")
        b = f.read(max_bytes + 1)
    if len(b) > max_bytes:   # grew while read
        raise NotRegularFile(f"{label}: more than {max_bytes:,} bytes; not read")
    return b
