"""Run *inside* a reused sandbox between leases: empty what a lease can write, then prove it.

Stdlib only. Two ways in: the docker backend passes this file to `python3 -I -S -c` (argv[1:] = the
directories to empty: workspace and /tmp; the last stdout line is the JSON verdict), and the bwrap exec
server imports it and calls `scrub(dirs)` in its own process (no interpreter start per reset).

It SIGKILLs every process but the exec server, its ancestors and pid 1, empties the given directories
plus /dev/shm and /dev/mqueue (chmod'ing a locked directory open first), removes every SysV shared
memory segment, semaphore set and message queue of the IPC namespace, clears the session, user,
user-session and persistent keyrings of the user namespace (where the kernel lets a sandbox reach them:
docker's default seccomp profile denies the key syscalls, so no key can exist there), and then checks
all of it again: leftover processes (zombies aside), entries in those directories, IPC objects, keys,
and any other writable mount. The verdict is {"clean": bool, "left": [what was found]}; the backend
throws the sandbox away (docker) or relaunches it (bwrap) rather than reuse it when it is not clean.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

_SPECIAL = ("/dev/shm", "/dev/mqueue")
_PSEUDO_FS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs"}
_IPC_KINDS = {"shm": 0, "sem": 0, "msg": 0}  # /proc/sysvipc/<kind>; IPC_RMID = 0 for all three


def _protected_pids():
    """This process, its ancestors (timeout, the exec server) and pid 1."""
    keep, pid = {1}, os.getpid()
    while pid > 1 and pid not in keep:
        keep.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return keep


def _live_strays(keep):
    strays = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state not in ("Z", "X"):  # a zombie holds no memory, files or IPC attachments
            strays.append(int(name))
    return strays


def kill_strays():
    keep = _protected_pids()
    deadline = time.monotonic() + 3.0
    while True:
        strays = _live_strays(keep)
        if not strays or time.monotonic() > deadline:
            return strays
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _unlock(path):
    # A directory the lease chmod'ed 000 cannot be emptied until its owner opens it again.
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, 0o700)
    except OSError:
        pass


def empty_dir(top):
    if not os.path.isdir(top):
        return
    for name in os.listdir(top):
        path = os.path.join(top, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                _unlock(path)
                for root, dirs, _files in os.walk(path):
                    for d in dirs:
                        _unlock(os.path.join(root, d))
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass  # what stays is reported by the check


def _ipc_ids(kind):
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return []
    return [int(row.split()[1]) for row in rows if row.split()]


def remove_ipc():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        calls = {"shm": lambda i: libc.shmctl(i, 0, None), "sem": lambda i: libc.semctl(i, 0, 0),
                 "msg": lambda i: libc.msgctl(i, 0, None)}
        for kind, call in calls.items():
            for ipc_id in _ipc_ids(kind):
                call(ipc_id)
    except Exception:
        subprocess.run(["ipcrm", "--all"], capture_output=True)


# keyctl(2) operations and the special keyring ids (linux/keyctl.h); syscall numbers per architecture.
_KEYCTL_GET_PERSISTENT, _KEYCTL_CLEAR, _KEYCTL_READ = 22, 7, 11
_KEYRINGS = {"session": -3, "user": -4, "user-session": -5}
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 130, "s390x": 280}


def _keyrings(libc, number):
    """{name: keyring id} of the keyrings a lease could leave keys in; the persistent one is made on
    the way when missing (an empty keyring: harmless), so it is cleared and checked like the others."""
    # Linked into the session keyring (a destination is required), which is cleared after it.
    persistent, _ = _key_call(libc, number, _KEYCTL_GET_PERSISTENT, -1, -3)
    return {**({"persistent": persistent} if persistent >= 0 else {}), **_KEYRINGS}


def _key_call(libc, number, *args):
    import ctypes

    result = libc.syscall(number, *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return result, ctypes.get_errno()


def clear_keyrings():
    """Clear every reachable keyring, then the names of the ones still holding keys (or unreadable
    for another reason than the key syscalls being unavailable: that would hide a key)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        number = _SYS_KEYCTL[os.uname().machine]
    except (OSError, KeyError, ImportError):
        return []  # no ctypes or an unknown architecture: the key syscalls are not reachable from here
    left = []
    buf = ctypes.create_string_buffer(4096)
    for name, ring in _keyrings(libc, number).items():
        _key_call(libc, number, _KEYCTL_CLEAR, ring)
        size, errno = _key_call(libc, number, _KEYCTL_READ, ring, buf, 4096)
        if size > 0:
            left.append(f"keyring {name} holds {size // 4} key(s)")
        elif size < 0 and errno not in (1, 2, 38, 126):  # EPERM/ENOSYS (seccomp), ENOENT, ENOKEY: none
            left.append(f"keyring {name} unreadable (errno {errno})")
    return left


def _writable_mounts(cleared):
    """Mount points this uid can write to, other than the ones emptied here."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), (right.split() or [""])[0]
        point = fields[4].encode().decode("unicode_escape")  # \040 and friends
        if fstype in _PSEUDO_FS or "rw" not in fields[5].split(","):
            continue
        if os.path.realpath(point) in cleared:
            continue
        try:
            device = stat.S_ISCHR(os.stat(point).st_mode) or stat.S_ISBLK(os.stat(point).st_mode)
        except OSError:
            continue
        if not device and os.access(point, os.W_OK):  # /dev/null masks (/proc/keys) hold nothing
            found.append(f"writable mount {point}")
    return found


def scrub(dirs):
    """Empty `dirs` and everything else a lease can write, then check it all: {"clean", "left"}."""
    tops = [os.path.realpath(p) for p in dirs] + list(_SPECIAL)
    kill_strays()
    for top in tops:
        empty_dir(top)
    remove_ipc()
    left = [f"process {pid}" for pid in kill_strays()]
    for top in tops:
        if os.path.isdir(top):
            left += [f"{top}/{name}" for name in os.listdir(top)]
    left += [f"sysv {kind} {i}" for kind in _IPC_KINDS for i in _ipc_ids(kind)]
    left += clear_keyrings()
    left += _writable_mounts(set(tops))
    return {"clean": not left, "left": left[:20]}


def main():
    print(json.dumps(scrub(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
