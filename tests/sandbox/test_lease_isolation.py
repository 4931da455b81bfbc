"""No lease outlives its lease (issue 26, item 3): real attacks from lease code on the exec server (the
only process in a sandbox a lease did not start) and on the sandbox's writable mount roots, each followed
by the next lease on the same pool checking that it is served from a clean baseline.

Every scenario is three leases of a pool of one: a probe (the baseline), the attack, the probe again.
The probe reads, from inside, what every command inherits and what a lease could have changed: the exec
server's limits, nice value, scheduling policy, CPU affinity, oom_score_adj and I/O priority (through
/proc/1, which stays readable when the server is non-dumpable), the probe's own inherited values, the
mode, owner and xattrs of every writable mount root, what /tmp, /workspace, /dev/shm, /dev/mqueue and
SysV IPC hold, and every live process. The attack either is refused by the kernel (EPERM, EACCES: the
server is the namespace's non-dumpable init, every command runs under its seccomp filter) or leaves a
change the scrub must find; then the sandbox is relaunched (a new pid 1, seen from inside as a new start
time of pid 1, and in the backend's own counters) and the next lease sees the baseline again.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import processes_with, run, wait_no_processes

pytestmark = pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64"), reason="the attacks use x86_64/aarch64 syscall numbers"
)

# ---- the probe: what the next lease sees -------------------------------------------------------------

PROBE = r"""
import ctypes, json, os, resource
libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_GET = {"x86_64": 252, "aarch64": 31}[os.uname().machine]

def ioprio(pid):
    r = libc.syscall(ctypes.c_long(IOPRIO_GET), ctypes.c_long(1), ctypes.c_long(pid))
    return r if r >= 0 else f"errno {ctypes.get_errno()}"

def stat_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # [0] is field 3 (state)

def ancestors():
    keep, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        pid = int(stat_of(pid)[1])
        keep.add(pid)
    return keep

def field(path, name):
    with open(path) as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":"))

def root_state(point):
    try:
        st = os.lstat(point)
        try:
            xattrs = sorted(os.listxattr(point, follow_symlinks=False))
        except OSError as e:
            xattrs = f"errno {e.errno}"
        return [oct(st.st_mode), st.st_uid, st.st_gid, xattrs]
    except OSError as e:
        return f"errno {e.errno}"

def listing(top):
    if not os.path.isdir(top):
        return None
    found = []
    for root, dirs, files in os.walk(top):
        found += [os.path.relpath(os.path.join(root, n), top) for n in dirs + files]
    return sorted(found)

def rlimits():
    found = []
    while True:
        try:
            found.append(resource.getrlimit(len(found)))
        except ValueError:
            return found

roots = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.partition(" - ")[0].split()
        if "rw" in fields[5].split(","):
            roots.append(fields[4].encode().decode("unicode_escape"))
server = stat_of(1)
keep = ancestors()
live = []
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in keep:
        try:
            if stat_of(name)[0] not in ("Z", "X"):
                live.append(open(f"/proc/{name}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
print(json.dumps({
    "incarnation": server[19],  # pid 1's start time: a relaunch gives a new one
    "server": {
        "state": server[0], "nice": server[16], "rt_priority": server[37], "policy": server[38],
        "limits": open("/proc/1/limits").read(),
        "cpus": field("/proc/1/status", "Cpus_allowed_list"),
        "oom_score_adj": open("/proc/1/oom_score_adj").read().strip(),
        "ioprio": ioprio(1),
    },
    "inherited": {
        "rlimits": rlimits(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "scheduler": [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority],
        "affinity": sorted(os.sched_getaffinity(0)),
        "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
        "ioprio": ioprio(0),
        "umask": os.umask(0o022),
    },
    "namespaces": {
        "hostname": os.uname().nodename,
        **{key: open(f"/proc/sys/{key}").read().strip()
           for key in ("kernel/domainname", "kernel/shmmax", "kernel/msgmnb", "kernel/sem", "fs/mqueue/msg_max")},
        "mounts": sorted(line.split()[4] for line in open("/proc/self/mountinfo")),
    },
    "roots": {point: root_state(point) for point in sorted(set(roots))},
    "contents": {top: listing(top) for top in ("/tmp", "/workspace", "/dev/shm", "/dev/mqueue")},
    "sysv": {k: len(open(f"/proc/sysvipc/{k}").read().splitlines()) - 1 for k in ("shm", "sem", "msg")},
    "processes": sorted(live),
}))
"""

# ---- the attacks ------------------------------------------------------------------------------------

# One program, run as `python3 -c ATTACK <group> <marker>`: it tries every attack of the group and
# prints [[label, outcome], ...] as JSON, the outcome "ok" (the call succeeded) or the errno's name.
ATTACK = r"""
import ctypes, errno, json, mmap, os, resource, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
MACHINE = os.uname().machine
NR = {
    "x86_64": {"ioprio_set": 251, "sched_setattr": 314, "process_vm_readv": 310, "process_vm_writev": 311,
               "migrate_pages": 256, "move_pages": 279, "setpriority": 141, "prlimit64": 302, "kcmp": 312,
               "perf_event_open": 298},
    "aarch64": {"ioprio_set": 30, "sched_setattr": 274, "process_vm_readv": 270, "process_vm_writev": 271,
                "migrate_pages": 238, "move_pages": 239, "setpriority": 140, "prlimit64": 261, "kcmp": 272,
                "perf_event_open": 241},
}[MACHINE]
NR.update(pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424)  # the same on every architecture
L = ctypes.c_long
group, marker = sys.argv[1], sys.argv[2]
out = []

def name(e):
    return errno.errorcode.get(e, str(e))

def rec(label, fn):
    try:
        fn()
    except OSError as e:
        out.append([label, name(e.errno)])
    else:
        out.append([label, "ok"])

def raw(number, *args):
    def call():
        r = libc.syscall(L(number), *(L(a) if isinstance(a, int) else a for a in args))
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return r
    return call

def sysc(nr_name, *args):
    return raw(NR[nr_name], *args)

def ptrace(request, pid):
    def call():
        if libc.ptrace(L(request), L(pid), None, None) == -1:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return call

class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def vm(nr_name):
    buf = ctypes.create_string_buffer(64)
    local, remote = Iov(ctypes.cast(buf, ctypes.c_void_p), 64), Iov(0x400000, 64)
    return sysc(nr_name, 1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)

def write(path, data):
    def call():
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return call

def cfn(fn, *args):
    def call():
        if fn(*args) == -1:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return call

def tool(argv):
    # A tool's failure counts as refused only when it says the kernel refused (a missing tool does not).
    def call():
        r = subprocess.run(argv, capture_output=True)
        why = r.stderr.decode(errors="replace")
        if r.returncode != 0:
            for code in (errno.EPERM, errno.EACCES):
                if os.strerror(code) in why:
                    raise OSError(code, why)
            raise OSError(errno.EINVAL, why)
    return call

if group == "ptrace":
    rec("PTRACE_ATTACH 1", ptrace(16, 1))
    rec("PTRACE_SEIZE 1", ptrace(0x4206, 1))
    rec("process_vm_readv 1", vm("process_vm_readv"))
    rec("process_vm_writev 1", vm("process_vm_writev"))
    pidfd = sysc("pidfd_open", 1, 0)()
    for fd in (0, 1, 2):
        rec(f"pidfd_getfd 1 fd {fd}", sysc("pidfd_getfd", pidfd, fd, 0))
    page = Iov(ctypes.cast(ctypes.create_string_buffer(4096), ctypes.c_void_p), 4096)
    rec("process_madvise 1", raw(440, pidfd, ctypes.byref(page), 1, 20, 0))  # MADV_COLD
    rec("kcmp 1 files", sysc("kcmp", 1, os.getpid(), 0, 0, 0))  # KCMP_FILE
    attr = (ctypes.c_uint32 * 32)(1, 128)  # PERF_TYPE_SOFTWARE, size 128, config 0 (cpu clock)
    rec("perf_event_open 1", sysc("perf_event_open", ctypes.byref(attr), 1, -1, -1, 0))
    rec("read /proc/1/pagemap", lambda: open("/proc/1/pagemap", "rb").read(8))
elif group == "procfs":
    rec("open /proc/1/mem rw", lambda: os.close(os.open("/proc/1/mem", os.O_RDWR)))
    rec("read /proc/1/environ", lambda: open("/proc/1/environ", "rb").read())
    rec("list /proc/1/fd", lambda: os.listdir("/proc/1/fd"))
    rec("write /proc/1/fd/1", write("/proc/1/fd/1", b"\0\0\0\2{}"))
    rec("open /proc/1/fd/0", lambda: os.close(os.open("/proc/1/fd/0", os.O_RDONLY)))
    rec("list /proc/1/map_files", lambda: os.listdir("/proc/1/map_files"))
    rec("readlink /proc/1/exe", lambda: os.readlink("/proc/1/exe"))
    rec("readlink /proc/1/cwd", lambda: os.readlink("/proc/1/cwd"))
    rec("list /proc/1/root", lambda: os.listdir("/proc/1/root/"))
    for entry, data in (("autogroup", b"19"), ("timerslack_ns", b"100000000"), ("comm", b"evil"),
                        ("coredump_filter", b"0x7f"), ("clear_refs", b"1"), ("sched", b"0"),
                        ("oom_score_adj", b"1000"), ("oom_score_adj", b"-1000"), ("oom_adj", b"15")):
        rec(f"write /proc/1/{entry} {data.decode()}", write(f"/proc/1/{entry}", data))
elif group == "prlimit":
    for res in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        number = getattr(resource, res)
        soft, hard = resource.getrlimit(number)
        rec(f"prlimit 1 {res} 1", lambda: resource.prlimit(1, number, (1, 1)))
        rec(f"prlimit 1 {res} unchanged", lambda: resource.prlimit(1, number, (soft, hard)))
    rec("prlimit64 raw 1 NOFILE", sysc("prlimit64", 1, resource.RLIMIT_NOFILE,
                                       ctypes.byref((ctypes.c_uint64 * 2)(4, 4)), 0))
elif group == "priority":
    rec("setpriority PROCESS 1", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
    rec("setpriority PGRP 1", lambda: os.setpriority(os.PRIO_PGRP, 1, 19))
    rec("setpriority USER me", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
    rec("setpriority USER 0", lambda: os.setpriority(os.PRIO_USER, 0, 19))
    for who, arg in ((1, 1), (2, 1), (2, 0), (3, os.getuid()), (3, 0)):  # PROCESS, PGRP, USER
        for cls in (3, 2):  # IOPRIO_CLASS_IDLE, IOPRIO_CLASS_BE level 7
            rec(f"ioprio_set who {who} {arg} class {cls}", sysc("ioprio_set", who, arg, (cls << 13) | 7))
elif group == "scheduler":
    rec("sched_setscheduler 1 IDLE", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)))
    rec("sched_setscheduler 1 BATCH", lambda: os.sched_setscheduler(1, os.SCHED_BATCH, os.sched_param(0)))
    rec("sched_setparam 1", lambda: os.sched_setparam(1, os.sched_param(0)))
    rec("sched_setaffinity 1", lambda: os.sched_setaffinity(1, {min(os.sched_getaffinity(0))}))
    attr = (ctypes.c_uint32 * 14)(56, 5, 0, 19)  # size, SCHED_IDLE, flags, nice 19
    rec("sched_setattr 1", sysc("sched_setattr", 1, ctypes.byref(attr), 0))
    nodes = ctypes.c_ulong(1)
    rec("migrate_pages 1", sysc("migrate_pages", 1, 64, ctypes.byref(nodes), ctypes.byref(nodes)))
    rec("move_pages 1", sysc("move_pages", 1, 0, 0, 0, 0, 0))
elif group == "tools":
    me = str(os.getuid())
    for argv in (["prlimit", "--pid", "1", "--nofile=16:16"], ["prlimit", "--pid", "1", "--nproc=1:1"],
                 ["prlimit", "--pid", "1", "--as=1048576"], ["prlimit", "--pid", "1", "--cpu=1"],
                 ["renice", "-n", "19", "-p", "1"], ["renice", "-n", "19", "-g", "1"],
                 ["renice", "-n", "19", "-u", me], ["ionice", "-c", "3", "-p", "1"],
                 ["ionice", "-c", "3", "-u", me], ["taskset", "-p", "1", "1"],
                 ["chrt", "-i", "-p", "0", "1"], ["chrt", "-b", "-p", "0", "1"]):
        rec(" ".join(argv), tool(argv))
elif group == "compat":
    # x32 (the 0x40000000 bit) and i386 (int 0x80) numbering, which a filter written for x86_64 calls
    # alone would let through: setpriority(PRIO_PROCESS, 1, 19) and prlimit64(1, NOFILE, {4, 4}).
    rec("x32 setpriority 1", raw(0x40000000 | NR["setpriority"], 0, 1, 19))
    rec("x32 prlimit64 1", raw(0x40000000 | NR["prlimit64"], 1, resource.RLIMIT_NOFILE,
                                ctypes.byref((ctypes.c_uint64 * 2)(4, 4)), 0))
    if MACHINE == "x86_64":
        for label, nr, args in (("i386 setpriority 1", 97, (0, 1, 19)), ("i386 sched_setaffinity 1", 241, (1, 0, 0))):
            code = bytes([0x53, 0xB8]) + nr.to_bytes(4, "little")  # push rbx; mov eax, nr
            for op, value in zip((0xBB, 0xB9, 0xBA), args):  # mov ebx / ecx / edx, imm32
                code += bytes([op]) + value.to_bytes(4, "little")
            code += bytes([0xCD, 0x80, 0x5B, 0xC3])  # int 0x80; pop rbx; ret
            child = ("import ctypes, mmap, sys\n"
                     "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
                     f"m.write({code!r})\n"
                     "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
                     "print(f())\n")
            r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
            result = r.stdout.strip()
            if r.returncode != 0:
                out.append([label, f"crashed {r.returncode}"])
            else:
                out.append([label, "ok" if result == "0" else name(-int(result))])
elif group == "namespaces":
    # What would outlive the lease in a reused sandbox's namespaces (uts, ipc, mount, user) or beyond.
    rec("sethostname", cfn(libc.sethostname, b"evil", 4))
    rec("setdomainname", cfn(libc.setdomainname, b"evil", 4))
    for path, data in (("kernel/hostname", b"evil"), ("kernel/domainname", b"evil"), ("kernel/shmmax", b"1"),
                       ("kernel/msgmnb", b"1"), ("kernel/sem", b"1 1 1 1"), ("fs/mqueue/msg_max", b"1"),
                       ("kernel/core_pattern", b"|/tmp/x")):
        rec(f"write /proc/sys/{path}", write(f"/proc/sys/{path}", data))
    os.makedirs("/tmp/mnt", exist_ok=True)
    rec("mount tmpfs", cfn(libc.mount, b"none", b"/tmp/mnt", b"tmpfs", L(0), None))
    rec("umount /tmp", cfn(libc.umount2, b"/tmp", L(2)))  # MNT_DETACH
    rec("remount / rw", cfn(libc.mount, b"none", b"/", None, L(32 | 4096), None))  # MS_REMOUNT | MS_BIND
    rec("unshare user", cfn(libc.unshare, L(0x10000000)))
    rec("unshare mount", cfn(libc.unshare, L(0x00020000)))
    rec("unshare ipc", cfn(libc.unshare, L(0x08000000)))
    for ns in ("mnt", "ipc", "uts", "net", "pid", "user"):
        rec(f"open /proc/1/ns/{ns}", lambda: os.close(os.open(f"/proc/1/ns/{ns}", os.O_RDONLY)))
    rec("chroot /tmp", lambda: os.chroot("/tmp"))
    rec("setuid 0", lambda: os.setuid(0))
    rec("mknod a device", lambda: os.mknod("/tmp/mem", 0o600 | 0o020000, os.makedev(1, 1)))
    ts = (ctypes.c_long * 2)(0, 0)
    rec("clock_settime REALTIME", cfn(libc.clock_settime, L(0), ctypes.byref(ts)))
    rec("reboot CAD_OFF", cfn(libc.reboot, ctypes.c_int(0)))
elif group == "signals":
    for sig in ("SIGKILL", "SIGSTOP", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGSEGV", "SIGBUS",
                "SIGUSR1", "SIGUSR2", "SIGABRT", "SIGALRM", "SIGPIPE", "SIGXCPU", "SIGTSTP", "SIGTTIN"):
        rec(f"kill 1 {sig}", lambda: os.kill(1, getattr(signal, sig)))
    # (no killpg(1): that is kill(-1), which reaches every process but init and the caller, the lease's own)
    pidfd = sysc("pidfd_open", 1, 0)()
    rec("pidfd_send_signal 1 SIGKILL", sysc("pidfd_send_signal", pidfd, signal.SIGKILL, 0, 0))
    rec("pidfd_send_signal 1 SIGSTOP", sysc("pidfd_send_signal", pidfd, signal.SIGSTOP, 0, 0))
    rec("kill 1 SIGRTMIN", lambda: os.kill(1, signal.SIGRTMIN))
    time.sleep(0.2)
    with open("/proc/1/stat") as f:
        out.append(["pid 1 state after", f.read().rsplit(")", 1)[1].split()[0]])
elif group == "self":
    # What the filter still allows: a command changing itself (what nice, ulimit and taskset do).
    # Relative to the niceness the lease inherited: lowering it (a suite run under `nice -n 10` asking for
    # 5) needs CAP_SYS_NICE and is EACCES whatever the filter says.
    rec("setpriority self +5", lambda: os.setpriority(os.PRIO_PROCESS, 0,
                                                      min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)))
    rec("setpriority own group", lambda: os.setpriority(os.PRIO_PGRP, 0, min(19, os.getpriority(os.PRIO_PGRP, 0) + 6)))
    rec("prlimit self NOFILE", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, (64, 64)))
    rec("setrlimit self NPROC", lambda: resource.setrlimit(resource.RLIMIT_NPROC, (32, 32)))
    rec("sched_setaffinity self", lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    rec("sched_setscheduler self BATCH", lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0)))
    rec("ioprio_set self IDLE", sysc("ioprio_set", 1, 0, 3 << 13))
    rec("oom_score_adj self 1000", write("/proc/self/oom_score_adj", b"1000"))
    rec("umask self", lambda: os.umask(0o777))
    # ... and a process it started may not be touched through these calls either, only by ptrace.
    child = subprocess.Popen(["sleep", "5"])
    rec("setpriority own child", lambda: os.setpriority(os.PRIO_PROCESS, child.pid, 10))
    rec("PTRACE_SEIZE own child", ptrace(0x4206, child.pid))
    rec("kill own child", lambda: os.kill(child.pid, signal.SIGKILL))
    child.wait()
    rec("nice in a shell", tool(["/bin/sh", "-c", "nice -n 3 true && ulimit -n 50 && taskset -c 0 true"]))
else:
    raise SystemExit(f"unknown attack group {group}")
print(json.dumps(out))
"""

REFUSED = {"EPERM", "EACCES"}
_NOT_SUPPORTED = {"EROFS", "EOPNOTSUPP", "ENOTSUP"}  # an xattr where the filesystem keeps none


async def _probe(sb) -> dict:
    result = await sb.exec(["python3", "-c", PROBE], timeout=30)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def _incarnation_of(sb) -> str:
    """The backend's own identity of the sandbox process (bwrap's host pid, docker's container)."""
    return str(sb._proc.pid) if sb.kind == "bwrap" else sb.container.id


async def _three_leases(pool, attack):
    """Baseline probe, `attack(sb)`, probe: (baseline, attack's value, after, backend-side facts)."""
    async with pool.acquire() as sb:
        baseline = await _probe(sb)
        first, first_id = sb, _incarnation_of(sb)
    await pool.drain()
    relaunched_before = dict(first.resets) if first.kind == "bwrap" else None
    async with pool.acquire() as sb:
        assert sb is first, "a pool of one must hand the same sandbox to the attack"
        attacked = await attack(sb)
    await pool.drain()
    async with pool.acquire() as sb:
        after = await _probe(sb)
        second, second_id = sb, _incarnation_of(sb)
    await pool.drain()
    facts = {
        "same_sandbox": second is first,
        "new_process": second_id != first_id,
        "replacements": pool.stats().replacement_causes,
    }
    if first.kind == "bwrap":
        facts["relaunches"] = first.resets["relaunched"] - relaunched_before["relaunched"]
        facts["scrub_left"] = list(first.last_scrub_left)
    return baseline, attacked, after, facts


def _assert_clean(baseline: dict, after: dict, new_container: bool = False) -> None:
    for key in baseline:
        if key != "incarnation":
            was, now = baseline[key], after[key]
            if key == "namespaces" and new_container:  # docker names each container's host after its id
                was, now = ({k: v for k, v in d.items() if k != "hostname"} for d in (was, now))
            assert now == was, f"{key} differs in the next lease"


def _assert_kept(backend: str, baseline: dict, after: dict, facts: dict) -> None:
    """Nothing to find: the sandbox was scrubbed and kept, with the same server (no relaunch)."""
    _assert_clean(baseline, after)
    assert after["incarnation"] == baseline["incarnation"], "the exec server was replaced"
    assert facts["same_sandbox"] and not facts["new_process"] and facts["replacements"] == {}, facts
    if backend == "bwrap":
        assert facts["relaunches"] == 0, facts


def _assert_relaunched(backend: str, baseline: dict, after: dict, facts: dict) -> None:
    """The scrub found a drift: the next lease runs under a new exec server, from a clean baseline."""
    _assert_clean(baseline, after, new_container=backend == "docker")
    assert after["incarnation"] != baseline["incarnation"], "the same exec server served the next lease"
    assert facts["new_process"], facts
    if backend == "bwrap":  # relaunched in place: the same sandbox object, a new bwrap
        assert facts["same_sandbox"] and facts["relaunches"] == 1 and facts["replacements"] == {}, facts
    else:  # the reset refused the container: the pool replaced it
        assert not facts["same_sandbox"] and facts["replacements"] == {"reset_failed": 1}, facts


def _attack_group(group: str, marker: str = "x"):
    async def attack(sb):
        result = await sb.exec(["python3", "-c", ATTACK, group, marker], timeout=60)
        assert result.exit_code == 0, result
        return json.loads(result.stdout)

    return attack


# ---- refused outright: the server is out of reach --------------------------------------------------


@pytest.mark.parametrize(
    "group", ["ptrace", "procfs", "prlimit", "priority", "scheduler", "tools", "compat", "namespaces"]
)
def test_lease_code_cannot_touch_the_exec_server(backend, pool_factory, group):
    """ptrace, process_vm_*, pidfd_getfd, process_madvise, kcmp, perf_event_open, /proc/1 writes and reads of its memory, descriptors and
    environment, prlimit of every resource, renice and I/O priority (by pid, group and user), the
    scheduler, affinity and page migration, through the syscalls, the util-linux tools and the x32 and
    i386 numberings; and what would stay in the sandbox's namespaces (hostname, IPC sysctls, mounts,
    nested namespaces, /proc/1/ns): every one is refused, and the next lease sees the server as it was."""
    if group == "compat" and os.uname().machine != "x86_64":
        pytest.skip("x32 and i386 numberings are x86_64's")

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, _attack_group(group))

    baseline, outcomes, after, facts = run(scenario())
    assert len(outcomes) >= 3, outcomes
    # int 0x80 on a kernel built without i386 emulation kills the caller: refused as well.
    allowed = {"procfs": REFUSED | {"ENOENT", "EROFS"},  # an entry this kernel lacks; /proc read-only
               # /proc/sys read-only; ENOSPC: bwrap's --disable-userns leaves no user namespace to make;
               # EINVAL: uid 0 is not mapped into bwrap's user namespace
               "namespaces": REFUSED | {"EROFS", "ENOSPC", "EINVAL"}}.get(group, REFUSED)
    bad = [o for o in outcomes if o[1] not in allowed and not o[1].startswith("crashed")]
    assert bad == [], f"not refused: {bad}"
    _assert_kept(backend, baseline, after, facts)


def test_signals_to_the_exec_server_are_dropped(backend, pool_factory):
    """kill and pidfd_send_signal of SIGKILL, SIGSTOP and every other default-action signal
    to pid 1: the kernel drops them (the namespace's init has no handler), the command that sent them
    runs on, and the next lease is served by the same server, unchanged."""
    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, _attack_group("signals"))

    baseline, outcomes, after, facts = run(scenario())
    state = dict(outcomes).pop("pid 1 state after")
    assert state in ("S", "R"), outcomes  # neither stopped (T) nor dying
    assert [o for o in outcomes if o[0].startswith(("kill", "pidfd"))], outcomes
    _assert_kept(backend, baseline, after, facts)


def test_what_the_filter_still_allows_stays_with_the_lease(backend, pool_factory):
    """A command may renice, limit, pin and reschedule itself (nice, ulimit, taskset work), but not
    even a process it started through those calls; whatever it did to itself is gone next lease."""
    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, _attack_group("self"))

    baseline, outcomes, after, facts = run(scenario())
    got = dict(outcomes)
    for label in ("setpriority self +5", "setpriority own group", "prlimit self NOFILE", "setrlimit self NPROC",
                  "sched_setaffinity self", "sched_setscheduler self BATCH", "ioprio_set self IDLE",
                  "umask self", "nice in a shell", "PTRACE_SEIZE own child", "kill own child"):
        assert got[label] == "ok", (label, outcomes)
    # bwrap mounts /proc read-only (bwrap.py: /proc/sys would be writable otherwise)
    assert got["oom_score_adj self 1000"] == ("EROFS" if backend == "bwrap" else "ok"), outcomes
    assert got["setpriority own child"] == "EPERM", outcomes
    _assert_kept(backend, baseline, after, facts)


# ---- processes left running -----------------------------------------------------------------------

_LEFT_RUNNING = {
    # the classic daemon: fork, setsid, fork again, parent exits
    "double_fork_setsid": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                          "        tick()\n    os._exit(0)\nos.wait()\n",
    # deaf to the polite signals, in a process group of its own
    "ignores_signals": "import os, signal\nfor s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):\n"
                       "    signal.signal(s, signal.SIG_IGN)\nif os.fork() == 0:\n    os.setpgid(0, 0)\n    tick()\n",
    # stopped: a SIGKILL still reaches it
    "stopped": "import os, signal\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               "        os.kill(os.getpid(), signal.SIGSTOP)\n        tick()\n    tick()\n",
    # a chain of processes each forking and exiting, never the same pid twice (a kill-by-pid evader)
    "fork_hopper": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    end = time.time() + 60\n"
                   "    while time.time() < end:\n        if os.fork():\n            os._exit(0)\n"
                   "        open('/tmp/hop-' + MARK, 'w').write(str(os.getpid()))\n        time.sleep(0.02)\n",
    # a tracer holding a traced child: both must go
    "tracer_and_tracee": "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nchild = os.fork()\nif child == 0:\n"
                         "    tick()\nif os.fork() == 0:\n    os.setsid()\n"
                         "    libc.ptrace(0x4206, child, None, None)\n    tick()\n",
    # a process named like the server, hoping a cleanup spares "python3 sbxd.py"
    "mimics_the_server": "import os, sys\nif os.fork() == 0:\n    os.setsid()\n"
                         "    os.execv(sys.executable, [sys.executable, '-c', PRELUDE + 'tick()', '/opt/arlctl/sbxd.py', MARK])\n",
}

_PRELUDE = (
    "import os, sys, time\nMARK = sys.argv[-1]\n"
    "def tick():\n"
    "    while True:\n"
    "        for d in ('/tmp', '/workspace', '/dev/shm'):\n"
    "            try:\n"
    "                open(f'{d}/tick-{MARK}', 'w').write(str(time.time()))\n"
    "            except OSError:\n"
    "                pass\n"
    "        time.sleep(0.01)\n"
)


@pytest.mark.parametrize("variant", sorted(_LEFT_RUNNING))
def test_a_process_left_running_does_not_survive_into_the_next_lease(backend, pool_factory, variant):
    """Each variant leaves processes behind that keep writing into /tmp, /workspace and /dev/shm. They
    are gone when the command's exec returns (host view: no process carries the marker), the next
    lease finds no process and none of their files, and nothing that needed a relaunch was left."""
    marker = f"LEFT{uuid.uuid4().hex[:10]}"
    program = _PRELUDE + f"PRELUDE = {_PRELUDE!r}\n" + _LEFT_RUNNING[variant] + "time.sleep(0.3)\nprint('planted')\n"

    async def attack(sb):
        planted = await sb.exec(["python3", "-c", program, marker], timeout=30)
        alive = await sb.exec(f"sleep 0.2; ls /tmp /workspace /dev/shm | grep -c {marker[:4]} || true", timeout=30)
        return planted, alive, wait_no_processes(marker)

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, attack)

    baseline, (planted, alive, host_left), after, facts = run(scenario())
    assert planted.exit_code == 0 and "planted" in planted.stdout, planted
    assert int(alive.stdout.strip()) >= 1, "the attack planted nothing to find"  # its files, not its processes
    assert host_left == [], f"lease processes still run on the host: {host_left}"
    assert processes_with(marker) == []
    assert after["processes"] == [] and after["contents"] == baseline["contents"], after
    _assert_kept(backend, baseline, after, facts)


# ---- files left behind -----------------------------------------------------------------------------

_FILES_LEFT = r"""
set -e
for d in /tmp /workspace /dev/shm; do
  echo x > "$d/.hidden"; mkdir -p "$d/a/b/c/d" && echo deep > "$d/a/b/c/d/f"
  mkdir "$d/locked" && echo s > "$d/locked/s" && mkdir "$d/locked/inner" && chmod 000 "$d/locked/inner" "$d/locked"
  mkfifo "$d/fifo"; ln -s /proc/1/root "$d/link-to-server-root"; ln -s "$d/a/b/c/d/f" "$d/link"
  ln "$d/.hidden" "$d/hardlink"; mkdir -m 1777 "$d/sticky"; touch "$d/unreadable" && chmod 000 "$d/unreadable"
  touch "$d/-n" "$d/with space" "$d/$(printf 'nl\nname')"
  python3 -c "import os, sys; os.setxattr(sys.argv[1], 'user.lease', b'1')" "$d/a" 2>/dev/null || true
  python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$d/sock"
  for i in $(seq 1 200); do : > "$d/many-$i"; done
done
[ -d /dev/mqueue ] && python3 -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
mq_open = getattr(libc, 'mq_open', None) or ctypes.CDLL('librt.so.1').mq_open
print(mq_open(b'/left', os.O_CREAT | os.O_RDWR, 0o600, None))"
ipcmk -M 4096 >/dev/null && ipcmk -S 3 >/dev/null && ipcmk -Q >/dev/null
ls -A /tmp /workspace /dev/shm | wc -l
"""


def test_files_left_in_every_writable_place_are_gone_next_lease(backend, pool_factory, snapshot):
    """Hidden, deep, locked (chmod 000 at two levels), fifo, socket, links out (to /proc/1/root), hard
    links, sticky and unreadable entries, odd names and 200 files in /tmp, /workspace and /dev/shm, a
    POSIX message queue and SysV objects: all gone next lease, the workspace is the pristine snapshot,
    and the scrub did it in place."""
    async def attack(sb):
        return await sb.exec(["/bin/sh", "-c", _FILES_LEFT], timeout=60)

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, attack)

    baseline, planted, after, facts = run(scenario())
    assert planted.exit_code == 0, planted
    assert int(planted.stdout.split()[-1]) > 600, planted
    assert baseline["contents"]["/tmp"] == [] and baseline["contents"]["/dev/shm"] == []
    expected = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*"))
    assert after["contents"]["/workspace"] == expected
    assert after["sysv"] == {"shm": 0, "sem": 0, "msg": 0}
    _assert_kept(backend, baseline, after, facts)


# ---- mount roots: the drift the scrub must find -------------------------------------------------------

# Change every writable mount root the lease can: its mode, its user xattrs, its owner. Prints the
# roots as [point, {"mode": outcome, "xattr": outcome, "chown": outcome}].
_ROOTS = r"""
import errno, json, os, sys
how = sys.argv[1]
points = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.partition(" - ")[0].split()
        if "rw" in fields[5].split(","):
            points.append(fields[4].encode().decode("unicode_escape"))
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
done = []
for point in sorted(set(points)):
    st = os.lstat(point)
    tried = {}
    if how in ("mode", "all"):
        tried["mode"] = attempt(lambda: os.chmod(point, {"/tmp": 0o700}.get(point, 0o777)))
    if how in ("mode-zero", "all"):
        tried["mode-zero"] = attempt(lambda: os.chmod(point, 0o000))
    if how in ("xattr", "all"):
        tried["xattr"] = attempt(lambda: os.setxattr(point, "user.left", b"by a lease", follow_symlinks=False))
    if how in ("chown", "all"):
        tried["chown other"] = attempt(lambda: os.chown(point, 0, 0, follow_symlinks=False))
        tried["chgrp other"] = attempt(lambda: os.chown(point, -1, 65534, follow_symlinks=False))
        tried["chown self"] = attempt(lambda: os.chown(point, st.st_uid, st.st_gid, follow_symlinks=False))
    done.append([point, tried])
print(json.dumps(done))
"""


@pytest.mark.parametrize("how", ["mode", "mode-zero", "xattr", "all"])
def test_a_changed_mount_root_relaunches_the_sandbox(backend, pool_factory, how):
    """The lease changes the mode (0777, 0700 on /tmp, 000) or sets a user xattr on every writable
    mount root it owns (/workspace, /tmp, /dev/shm, /dev/mqueue where it owns them). The scrub finds
    the drift, so the sandbox is not reused: bwrap relaunches with new directories, docker's pool
    replaces the container; the next lease's roots are as at the first."""
    async def attack(sb):
        result = await sb.exec(["python3", "-c", _ROOTS, how], timeout=30)
        assert result.exit_code == 0, result
        return dict(json.loads(result.stdout))

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, attack)

    baseline, tried, after, facts = run(scenario())
    changed = sorted(point for point, outcomes in tried.items() if "ok" in outcomes.values())
    assert {"/workspace", "/tmp"} <= set(changed), tried  # the lease owns both: the attack took
    odd = {p: o for p, o in tried.items() if set(o.values()) - {"ok", "EINVAL", *_NOT_SUPPORTED, *REFUSED}}
    assert odd == {}, odd
    _assert_relaunched(backend, baseline, after, facts)
    if backend == "bwrap":
        drifted = [line for line in facts["scrub_left"] if line.startswith("mount root ")]
        assert any(line.startswith("mount root /tmp:") for line in drifted), facts["scrub_left"]


def test_a_mount_root_cannot_be_given_away(backend, pool_factory):
    """chown of every writable mount root to root or chgrp to nogroup is refused (no CAP_CHOWN, or an
    id the user namespace does not map); a chown to its own owner is a no-op the scrub rightly keeps."""
    async def attack(sb):
        result = await sb.exec(["python3", "-c", _ROOTS, "chown"], timeout=30)
        assert result.exit_code == 0, result
        return dict(json.loads(result.stdout))

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _three_leases(pool, attack)

    baseline, tried, after, facts = run(scenario())
    for point, outcomes in tried.items():
        st = baseline["roots"][point]
        if isinstance(st, list) and st[1] == 0 and st[2] == 0:
            continue  # already root's: a chown to root would change nothing
        # EINVAL: on bwrap, root and nogroup are not mapped into the sandbox's user namespace at all
        refused = REFUSED | {"EINVAL"}
        assert outcomes["chown other"] in refused and outcomes["chgrp other"] in refused, (point, outcomes)
    _assert_kept(backend, baseline, after, facts)


# ---- the detector itself ----------------------------------------------------------------------------

_DRIFT = r"""
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
import _sbxd
_sbxd._BASELINE = _sbxd._own_state()
found = {"untouched": _sbxd._drift()}
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 64), min(hard, 64)))
found["nofile"] = _sbxd._drift()
os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)
found["nice"] = _sbxd._drift()
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
found["scheduler"] = _sbxd._drift()
cpus = sorted(os.sched_getaffinity(0))
if len(cpus) > 1:
    os.sched_setaffinity(0, cpus[:1])
found["affinity"] = _sbxd._drift()
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("999")
found["oom"] = _sbxd._drift()
_sbxd._BASELINE = None
found["no baseline"] = _sbxd._drift()
print(json.dumps(found))
"""


def test_the_drift_check_names_every_inherited_setting_a_server_could_lose():
    """_sbxd's own check, in a real process changing itself step by step: nothing at first, then each
    change named (rlimit, nice, scheduler, affinity, oom_score_adj), and no baseline is a drift too."""
    here = Path(__file__).parents[2] / "arlctl" / "sandbox"
    r = subprocess.run([sys.executable, "-I", "-S", "-c", _DRIFT, str(here)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["untouched"] == []
    assert any(x.startswith("rlimit nofile of the exec server") for x in found["nofile"]), found
    assert any(x.startswith("nice of the exec server") for x in found["nice"]), found
    assert any(x.startswith("scheduler of the exec server") for x in found["scheduler"]), found
    if len(os.sched_getaffinity(0)) > 1:
        assert any(x.startswith("affinity of the exec server") for x in found["affinity"]), found
    assert any(x.startswith("oom_score_adj of the exec server") for x in found["oom"]), found
    assert found["no baseline"] == ["no baseline of the exec server's state"]


def test_the_filter_program_denies_foreign_architectures_first():
    """The generated BPF program checks the architecture before anything else and the x32 range next,
    and every guarded call's rule ends in a deny (so a new alternative can only widen by intent)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "arlctl" / "sandbox"))
    try:
        import _sbxd
    finally:
        del sys.path[0]
    for machine, (audit_arch, numbers) in _sbxd._ARCHES.items():
        program = _sbxd._filter_program(machine)
        deny, allow = (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)
        assert program[0] == (0x20, 0, 0, 4) and program[1][0] == 0x15 and program[1][3] == audit_arch
        assert program[1 + 1 + program[1][2]] == deny  # not this architecture: EPERM
        assert program[3][0] == 0x35 and program[3][3] == 0x40000000 and program[3 + 1 + program[3][1]] == deny
        assert program[-1] == deny and allow in program
        assert set(numbers) == set(_sbxd._GUARDED)
        assert all(insn[3] & 0xFFFF == errno.EPERM for insn in program if insn[0] == 0x06 and insn[3] != allow[3])
