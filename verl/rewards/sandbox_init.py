"""Launcher of the namespaced code sandbox: the first process of every sandboxed run.

Never imported by verl: `verl.rewards.sandbox` runs this file's text with
`python -I -S -c <source> <config>` as root (config: a dict, `marshal`led and hex-encoded;
`marshal` is built in, where importing `json` would cost ~7 ms per run). Standard library only. Steps:

1. (launcher, still in the trainer's namespaces) die with the trainer thread that started
   it (`PR_SET_PDEATHSIG`), then `unshare` new mount, PID, IPC, network and UTS namespaces;
2. fork the namespace's init (PID 1), which makes every mount private, mounts a small tmpfs
   as the new root, bind-mounts into it read-only the interpreter's prefix, the shared
   library directories and `/etc/ld.so.cache`, read-write the run's working directory, the
   devices `null`, `zero`, `random`, `urandom`, and a fresh `/proc` of the new PID
   namespace, then `chroot`s into it;
3. init forks the program (PID 2), which sets its resource limits, drops to the run's
   unprivileged uid/gid (no capabilities, so no way back out of the chroot), asks to die
   with init, installs the seccomp filter (when libseccomp is present) and runs the real
   program: in this same interpreter (`become`, the default: it was started with the same
   `-I -S` flags) or by `exec`ing the interpreter;
4. init reaps every process until the program exits and reports the program's raw wait
   status to the launcher through a pipe; init's exit tears the PID namespace down, which
   kills whatever the program left behind (a `setsid()` daemon included). The launcher
   then exits the way the program did (same code, or the same signal).

A setup failure exits with code 125 and a line `verl sandbox setup failed: ...` on stderr.
"""

import ctypes
import marshal
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP, CLONE_NEWTIME = 0x02000000, 0x00000080
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
SETUP_FAILED = 125

# Denied with EPERM by the seccomp filter (names unknown to this kernel/libseccomp skipped).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr",
    "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday",
    "clock_settime", "adjtimex", "iopl", "ioperm", "open_by_handle_at",
    "name_to_handle_at", "lookup_dcookie", "personality",
)  # fmt: skip
NEW_NAMESPACE_FLAGS = (
    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
    CLONE_NEWCGROUP, CLONE_NEWTIME,
)  # fmt: skip

libc = ctypes.CDLL(None, use_errno=True)


def fail(what: str) -> None:
    err = ctypes.get_errno()
    os.write(2, f"verl sandbox setup failed: {what}: {os.strerror(err)}\n".encode())
    os._exit(SETUP_FAILED)


def check(result: int, what: str) -> None:
    if result != 0:  # libc sets errno; libseccomp returns -errno instead
        fail(what if result == -1 else f"{what} (returned {result})")


def mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def bind(source: str, root: str, writable: bool = False, devices: bool = False) -> None:
    """Bind `source` at the same path under `root`; read-only unless `writable`."""
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if devices else MS_NODEV)
    mount(None, target, None, flags | (0 if writable else MS_RDONLY))


def build_root(cfg: dict) -> None:
    root = cfg["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=755")
    for path in cfg["links"]:  # /lib -> usr/lib on merged-/usr systems
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        os.symlink(os.readlink(path), root + path)
    for path in cfg["read_only"]:
        bind(path, root)
    for path in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"):
        bind(path, root, writable=True, devices=True)
    bind(cfg["workdir"], root, writable=True)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chmod(root, 0o755)
    os.chroot(root)
    os.chdir("/")


def seccomp_filter(cfg_splice_only=None):
    """A loaded-later libseccomp filter context, or None when libseccomp is missing.
    `cfg_splice_only`: `(pipe, target)` descriptors for `protect_pipe`, or None."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]

    class ArgCmp(ctypes.Structure):
        _fields_ = [
            ("arg", ctypes.c_uint),
            ("op", ctypes.c_int),
            ("datum_a", ctypes.c_uint64),
            ("datum_b", ctypes.c_uint64),
        ]

    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    masked_eq = 7
    ctx = ctypes.c_void_p(lib.seccomp_init(allow))
    if not ctx.value:
        fail("seccomp_init")
    add = lib.seccomp_rule_add_array
    add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    for name in DENIED_SYSCALLS:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr >= 0:
            check(add(ctx, eperm, nr, 0, None), f"seccomp rule {name}")
    clone = lib.seccomp_syscall_resolve_name(b"clone")
    for flag in NEW_NAMESPACE_FLAGS:  # clone(2) creating any new namespace
        cmp = ArgCmp(0, masked_eq, flag, flag)
        check(add(ctx, eperm, clone, 1, ctypes.byref(cmp)), "seccomp rule clone")
    # clone3 passes its flags in memory, which a filter cannot read: refuse it with ENOSYS
    # so the C library falls back to clone(2), whose flags the rules above see.
    clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
    if clone3 >= 0:
        check(add(ctx, enosys, clone3, 0, None), "seccomp rule clone3")
    if cfg_splice_only is not None:
        protect_pipe(lib, ctx, add, ArgCmp, *cfg_splice_only)
    return lib, ctx


def protect_pipe(lib, ctx, add, ArgCmp, pipe: int, target: int) -> None:
    """Let the program move data out of descriptor `pipe` only by splicing it into `target`:
    no read, no copy (tee, sendfile, copy_file_range, vmsplice), no duplicate to dodge these
    rules, and no io_uring (which would bypass them). Reopening it through /proc/self/fd is
    refused by the pipe's owner (root) and mode (0600)."""
    eperm, eq, ne = 0x00050000 | 1, 4, 1  # SCMP_ACT_ERRNO(EPERM), SCMP_CMP_EQ, SCMP_CMP_NE

    def deny(name: str, *conditions: tuple[int, int, int]) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return
        cmps = (ArgCmp * len(conditions))(*(ArgCmp(a, op, v, 0) for a, op, v in conditions))
        check(add(ctx, eperm, nr, len(conditions), cmps), f"seccomp rule {name}")

    for name in ("read", "readv", "pread64", "preadv", "preadv2", "dup", "dup2", "dup3",
                 "tee", "copy_file_range", "vmsplice"):  # fmt: skip
        deny(name, (0, eq, pipe))
    deny("sendfile", (1, eq, pipe))
    deny("fcntl", (0, eq, pipe), (1, eq, 0))  # F_DUPFD
    deny("fcntl", (0, eq, pipe), (1, eq, 1030))  # F_DUPFD_CLOEXEC
    deny("splice", (0, eq, pipe), (2, ne, target))
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        deny(name)


def run_program(cfg: dict, seccomp) -> None:
    """PID 2: limits, unprivileged ids, seccomp, then the program. Never returns."""
    try:
        os.chdir(cfg["workdir"])
        for kind, soft, hard in cfg["limits"]:
            resource.setrlimit(kind, (soft, hard))
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        # after the uid change, which clears the parent-death signal
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if seccomp is not None:
            lib, ctx = seccomp
            check(lib.seccomp_load(ctx), "seccomp_load")
        if not cfg["in_process"]:
            os.execv(cfg["argv"][0], cfg["argv"])
    except OSError as exc:
        os.write(2, f"verl sandbox setup failed: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    become(cfg["argv"])
    raise SystemExit(0)  # the program ran to its end: exit as an interpreter would


def become(argv: list) -> None:
    """Run `python -I -S script ...` or `python -I -S -c source ...` (argv) in this
    interpreter, which was started with the same flags: saves starting a second one
    (~8 ms). The program gets a fresh `__main__` module and its own `sys.argv`; an
    uncaught exception goes to `sys.excepthook` without this file's frames and exits 1,
    `SystemExit` and `atexit` behave as in a fresh interpreter."""
    if argv[3] == "-c":
        source, filename, sys.argv[:] = argv[4], "<string>", ["-c", *argv[5:]]
    else:
        with open(argv[3], "rb") as f:
            source, filename, sys.argv[:] = f.read(), argv[3], argv[3:]
    main_module = type(sys)("__main__")
    main_module.__builtins__ = __builtins__
    if filename != "<string>":
        main_module.__file__ = filename
    sys.modules["__main__"] = main_module
    try:
        exec(compile(source, filename, "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__.tb_next)
        raise SystemExit(1) from None


def init(cfg: dict, status_w: int) -> None:
    """PID 1 of the new PID namespace. Never returns."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        build_root(cfg)
        seccomp = seccomp_filter(cfg["splice_only"]) if cfg["seccomp"] else None
    except OSError as exc:
        os.write(2, f"verl sandbox setup failed: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    program = os.fork()
    if program == 0:
        os.close(status_w)
        run_program(cfg, seccomp)
    while True:  # as PID 1 we also reap whatever the program orphans
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == program:
            os.write(status_w, str(status).encode())
            os._exit(0)


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # it may re-raise the program's signal
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != cfg["parent_pid"]:  # the trainer died before the line above
        os._exit(SETUP_FAILED)
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
    check(libc.unshare(flags), "unshare")
    status_r, status_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(status_r)
        init(cfg, status_w)
    os.close(status_w)
    _, init_status = os.waitpid(child, 0)
    report = os.read(status_r, 64)
    if not report:
        code = os.waitstatus_to_exitcode(init_status)
        os.write(2, f"verl sandbox setup failed: init ended with {code}\n".encode())
        os._exit(SETUP_FAILED)
    status = int(report)
    if os.WIFSIGNALED(status):  # die the way the program died, for the parent's wait()
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


if __name__ == "__main__":  # run with `python -c`; importing it does nothing
    main()
